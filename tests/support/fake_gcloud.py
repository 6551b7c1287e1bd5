"""A stand-in `gcloud` for scripts/launch.py tpu: queued resources whose one TPU VM is a folder
on this machine, where `ssh --command` runs the command with bash (HOME = the VM's folder) and
`scp` copies into it. It plays what a spot slice does:

- `queued-resources create` ACCEPTED, then ACTIVE at the next `describe`; a new VM is an empty
  folder with the image's Python environment (a venv over the tests' own, so the bootstrap
  finds nothing to install);
- with FAKE_GCLOUD_PREEMPT_AT_STEP=K, the first VM is taken back once its train.log shows
  step K: train.py gets SIGTERM (it saves and exits 75), and the queued resource is SUSPENDED;
- `delete` stops what still runs and removes the VM's folder (its disk goes with it).

Every call is appended to FAKE_GCLOUD_DIR/calls.log, one shell-quoted line each.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

# run as a program (the gcloud on a test's PATH): the repository is three folders up
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIR = os.environ["FAKE_GCLOUD_DIR"]
STATE = os.path.join(DIR, "state.json")


def load():
    try:
        with open(STATE) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"resources": {}, "preempted": False}


def save(state):
    with open(STATE, "w") as f:
        json.dump(state, f)


def home(node):
    return os.path.join(DIR, "vms", node)


def new_vm(node):
    """The VM's disk: the image's Python (a venv over the tests' one) and nothing else."""
    venv = os.path.join(home(node), "ringstripe", ".venv")
    os.makedirs(os.path.join(venv, "bin"))
    real = os.path.join(ROOT, ".venv")
    real = real if os.path.isdir(real) else sys.prefix
    shutil.copy(os.path.join(real, "pyvenv.cfg"), venv)
    os.symlink(os.path.join(real, "bin", "python"), os.path.join(venv, "bin", "python"))
    os.symlink(os.path.join(real, "lib"), os.path.join(venv, "lib"))
    digest = subprocess.run("cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1",
                            shell=True, cwd=ROOT, capture_output=True, text=True).stdout
    with open(os.path.join(venv, ".pyproject.sha256"), "w") as f:
        f.write(digest)


def stop_training(node, wait=True):
    """SIGTERM to train.py on the VM; with wait, until its wrapper wrote train.exit."""
    pid_file = os.path.join(home(node), "train.pid")
    if not os.path.exists(pid_file):
        return
    wrapper = open(pid_file).read().strip()
    children = subprocess.run(["pgrep", "-P", wrapper], capture_output=True, text=True).stdout
    for pid in children.split():
        try:
            os.kill(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 120
    while wait and time.monotonic() < deadline:
        if os.path.exists(os.path.join(home(node), "train.exit")):
            return
        time.sleep(0.2)


def reached(node, step):
    try:
        log = open(os.path.join(home(node), "train.log")).read()
    except FileNotFoundError:
        return False
    return any(int(s) >= step for s in re.findall(r"^step (\d+)/", log, re.M))


def option(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def main(args):
    with open(os.path.join(DIR, "calls.log"), "a") as f:
        f.write(shlex.join(["gcloud", *args]) + "\n")
    state = load()
    if args[:3] != ["compute", "tpus", "queued-resources"] and args[:3] != ["compute", "tpus",
                                                                            "tpu-vm"]:
        sys.exit(f"fake gcloud: {shlex.join(args)} is not played")
    kind, verb, rest = args[2], args[3], args[4:]
    if kind == "queued-resources":
        name = rest[0]
        if verb == "create":
            if name in state["resources"]:
                sys.exit(f"ERROR: queued resource {name} already exists")
            node = option(rest, "node-id") or f"{option(rest, 'node-prefix')}-0"
            state["resources"][name] = {"state": "ACCEPTED", "node": node}
            new_vm(node)
        elif verb == "describe":
            resource = state["resources"].get(name)
            if resource is None:
                sys.exit(f"ERROR: NOT_FOUND: {name}")
            at = os.environ.get("FAKE_GCLOUD_PREEMPT_AT_STEP")
            if resource["state"] == "ACCEPTED":
                resource["state"] = "ACTIVE"
            elif (resource["state"] == "ACTIVE" and at and not state["preempted"]
                  and reached(resource["node"], int(at))):
                stop_training(resource["node"])
                resource["state"] = "SUSPENDED"
                state["preempted"] = True
            print(resource["state"])
        elif verb == "delete":
            resource = state["resources"].pop(name, None)
            if resource is None:
                sys.exit(f"ERROR: NOT_FOUND: {name}")
            stop_training(resource["node"], wait=False)
            shutil.rmtree(home(resource["node"]), ignore_errors=True)
        save(state)
        return
    node = rest[1].partition(":")[0] if verb == "scp" else rest[0]
    if not os.path.isdir(home(node)):
        sys.exit(f"ERROR: TPU VM {node} not found")
    if verb == "scp":
        shutil.copy(rest[0], os.path.join(home(node), rest[1].partition(":")[2]))
    elif verb == "ssh":
        command = option(rest, "command")
        env = dict(os.environ, HOME=home(node))
        sys.exit(subprocess.run(["bash", "-c", command], cwd=home(node), env=env).returncode)
    else:
        sys.exit(f"fake gcloud: tpu-vm {verb} is not played")


if __name__ == "__main__":
    main(sys.argv[1:])
