"""scripts/tpu_pod.py, run as a user runs it: the commands each subcommand runs (from --dry-run),
the checks on its input, what happens when a command fails. No gcloud and no network
(tests/support/tpu_pod_runs.py); what runs on the workers: tests/launch/test_tpu_pod_worker.py."""

import os
import shlex
import shutil
import subprocess
import tarfile
import time

import pytest

from launch.tpu_worker import run_script
from tests.support.tpu_pod_runs import (GCLOUD_TPU, POD, REPO, TRAIN, dry_run, launcher,
                                one_line_error, remote_script, tools_path, verb, with_tmpdir,
                                write_executable)


# --- create, delete, all ----------------------------------------------------------------------

def test_create_names_type_zone_and_version():
    (cmd,) = dry_run("create", *POD)
    assert cmd[:6] == [*GCLOUD_TPU, "create", "rs-v4"]
    assert "--accelerator-type=v4-32" in cmd
    assert "--zone=us-central2-b" in cmd
    assert "--version=tpu-ubuntu2204-base" in cmd
    assert not any(a.startswith("--project") or a in ("--spot", "--preemptible") for a in cmd)


def test_create_options():
    (cmd,) = dry_run("create", *POD, "--accelerator-type", "v5litepod-16", "--spot",
                     "--project", "my-proj", "--version", "v2-alpha-tpuv5-lite")
    assert {"--accelerator-type=v5litepod-16", "--spot", "--project=my-proj",
            "--version=v2-alpha-tpuv5-lite"} <= set(cmd)
    both = launcher("create", *POD, "--spot", "--preemptible", "--dry-run")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_all_runs_every_step_in_order_and_ends_with_delete():
    commands = dry_run("all", *POD, *TRAIN, "--", "--config.num_train_steps=100")
    assert [verb(c) for c in commands] == ["create", "tar", "scp", "ssh", "ssh", "ssh", "delete"]
    assert commands[-1] == [*GCLOUD_TPU, "delete", "rs-v4", "--quiet", "--zone=us-central2-b"]
    assert "--worker=0" in commands[5] and "tail" in remote_script(commands[5])
    assert "--distributed" in remote_script(commands[4])
    # Nothing is mounted: the setup ssh is the bootstrap alone.
    assert "pip install" in remote_script(commands[3])
    assert not any("mount" in remote_script(c) for c in commands if verb(c) == "ssh")
    # Every gcloud command carries the zone, and the project when one is given.
    with_project = dry_run("all", *POD, *TRAIN, "--project", "p1")
    assert all("--zone=us-central2-b" in c and "--project=p1" in c
               for c in with_project if c[0] == "gcloud")


def test_all_passes_a_bucket_workdir_unchanged_without_a_word():
    result = launcher("all", *POD, *TRAIN, "--dry-run")
    assert result.returncode == 0 and result.stderr == ""
    run = shlex.split(result.stdout.splitlines()[5][2:])
    assert "--workdir gs://my-bucket/runs/tiny --distributed" in remote_script(run)


@pytest.mark.parametrize("command", ["setup", "all"])
def test_bucket_is_refused_in_one_line_before_anything_runs(command, tmp_path):
    """--bucket mounted the bucket with gcsfuse; now it is refused, never silently ignored."""
    env, log = fake_gcloud(tmp_path, fail_on="nothing")
    train = TRAIN if command == "all" else []
    for bucket in ("my-bucket", "gs://my-bucket"):
        for dry in ([], ["--dry-run"]):
            result = launcher(command, *dry, *POD, "--bucket", bucket, *train, env=env)
            assert result.returncode == 2
            one_line_error(result, "--bucket is no longer needed", "gs://BUCKET/PATH",
                           "drop --bucket")
    assert not log.exists()  # gcloud was never called
    assert "--bucket" not in launcher(command, "--help").stdout  # hidden


def test_all_with_keep_does_not_delete():
    commands = dry_run("all", *POD, *TRAIN, "--keep")
    assert [verb(c) for c in commands] == ["create", "tar", "scp", "ssh", "ssh", "ssh"]


def test_delete():
    assert dry_run("delete", *POD) == [[*GCLOUD_TPU, "delete", "rs-v4", "--quiet",
                                        "--zone=us-central2-b"]]


# --- setup: copy to every worker, idempotent bootstrap -------------------------------------------

def test_setup_copies_the_code_to_every_worker(tmp_path):
    tar, scp, ssh = dry_run("setup", *POD, env=with_tmpdir(tmp_path))
    tarball = str(tmp_path / "ringstripe-rs-v4.tar.gz")
    assert tar[:3] == ["tar", "-czf", tarball]
    assert scp[:7] == [*GCLOUD_TPU, "scp", tarball, "rs-v4:ringstripe.tar.gz"]
    assert "--worker=all" in scp
    assert ssh[:6] == [*GCLOUD_TPU, "ssh", "rs-v4"] and "--worker=all" in ssh
    # The tar command as printed really runs, ships the code and leaves local state behind.
    subprocess.run(tar, check=True)
    with tarfile.open(tarball) as t:
        names = {n.removeprefix("./") for n in t.getnames()}
    assert {"train.py", "pyproject.toml", "configs/tiny.py", "scripts/tpu_pod.py"} <= names
    assert (REPO / ".venv").exists()  # so that its absence below means something
    assert not any(n.split("/")[0] in (".venv", ".git", "runs") for n in names)


OVERRIDES = ["--config.num_train_steps=100", "--config.data.source=/data/my corpus/*.txt"]


def test_run_starts_distributed_training_on_every_worker(tmp_path):
    (ssh,) = dry_run("run", *POD, *TRAIN, "--", *OVERRIDES)
    assert ssh[:6] == [*GCLOUD_TPU, "ssh", "rs-v4"] and "--worker=all" in ssh
    script = remote_script(ssh)

    # Run it in a worker's HOME whose venv python records its arguments and waits for `stop`.
    home = tmp_path / "home"
    write_executable(home / "ringstripe" / ".venv" / "bin" / "python", """#!/bin/bash
printf '%s\\n' "$@" > "$HOME/args.tmp" && mv "$HOME/args.tmp" "$HOME/args"
for _ in $(seq 200); do [ -f "$HOME/stop" ] && exit 0; sleep 0.05; done
""")
    env = {"HOME": str(home), "PATH": tools_path()}

    def run_remote():
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                              timeout=30)

    started = run_remote()
    assert started.returncode == 0, started.stderr
    pid = int((home / "train.pid").read_text())
    try:
        deadline = time.monotonic() + 10
        while not (home / "args").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        args = (home / "args").read_text().splitlines()
        assert args == ["train.py", "--config", "configs/tiny.py", "--workdir",
                        "gs://my-bucket/runs/tiny", "--distributed", *OVERRIDES]
        assert (home / "train.log").exists()

        again = run_remote()  # a second trainer would fight the first for the TPU
        assert again.returncode != 0 and "already running" in again.stderr
    finally:
        (home / "stop").touch()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(
            ["ps", "-p", str(pid), "-o", "stat="], capture_output=True,
            text=True).stdout.strip() not in ("", "Z"):
        time.sleep(0.05)
    (home / "args").unlink()
    restarted = run_remote()  # the old one is gone: starting again is fine
    assert restarted.returncode == 0, restarted.stderr
    (home / "stop").touch()


WANDB = {"WANDB_API_KEY": "k3y-never-printed", "WANDB_MODE": "online", "WANDB_PROJECT": "long ctx",
         "WANDB_ENTITY": "lab"}


def test_wandb_variables_reach_train_py_and_the_key_is_never_printed(tmp_path):
    """The launching shell's wandb variables: in train.py's environment on the worker, the key
    in a file only its user reads and on no printed or long-lived command line."""
    result = launcher("run", "--dry-run", *POD, *TRAIN,
                      env={**os.environ, "PATH": tools_path(), **WANDB})
    assert result.returncode == 0, result.stderr
    assert WANDB["WANDB_API_KEY"] not in result.stdout + result.stderr
    assert "WANDB_API_KEY=***" in result.stdout and "WANDB_ENTITY=lab" in result.stdout

    script = run_script("configs/tiny.py", "gs://my-bucket/runs/tiny", [], env=WANDB)
    home = tmp_path / "home"
    # The parent's command line first: "env" appearing is what the test waits for
    write_executable(home / "ringstripe" / ".venv" / "bin" / "python", """#!/bin/bash
ps -o args= -p $PPID > "$HOME/parent"
for v in WANDB_API_KEY WANDB_MODE WANDB_PROJECT WANDB_ENTITY; do echo "$v=${!v:-}"; done \
    > "$HOME/env.tmp" && mv "$HOME/env.tmp" "$HOME/env"
""")
    started = subprocess.run(["bash", "-c", script], env={"HOME": str(home), "PATH": tools_path()},
                             capture_output=True, text=True, timeout=30)
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 10
    while not (home / "env").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (home / "env").read_text().splitlines() == [f"{k}={v}" for k, v in WANDB.items()]
    assert (home / "train.env").stat().st_mode & 0o777 == 0o600
    assert WANDB["WANDB_API_KEY"] not in (home / "parent").read_text()


def train_workdir(ssh):
    """The --workdir value in the train.py command line of a `run` ssh command."""
    # nohup bash -c 'TRAIN; echo $? > "$HOME/train.exit"' > "$HOME/train.log" ...
    wrapped = shlex.split(remote_script(ssh).split("nohup ", 1)[1])[2]
    (train,) = [part for part in wrapped.split(";") if "train.py" in part]
    words = shlex.split(train)
    return words[words.index("--workdir") + 1]


def run_workdir(workdir):
    """`run --dry-run` with --workdir `workdir`: (the result, the train.py --workdir value on the
    workers)."""
    result = launcher("run", "--dry-run", *POD, "--config", "configs/tiny.py",
                      "--workdir", workdir)
    assert result.returncode == 0, result.stderr
    (check, ssh) = [shlex.split(line[2:]) for line in result.stdout.splitlines()]
    assert verb(check) == "compile-check"
    return result, train_workdir(ssh)


def test_run_passes_a_bucket_workdir_unchanged():
    result, workdir = run_workdir("gs://b/runs/x")
    assert workdir == "gs://b/runs/x" and result.stderr == ""  # train.py writes the bucket
    assert ".venv/bin/python train.py --config configs/tiny.py --workdir gs://b/runs/x " \
           "--distributed" in result.stdout

    # A path under /mnt/, where earlier versions mounted the bucket: kept, with a warning that
    # nothing mounts it any more and what to give instead.
    mounted, workdir = run_workdir("/mnt/b/runs/x")
    assert workdir == "/mnt/b/runs/x"
    (warning,) = mounted.stderr.strip().splitlines()
    assert warning.startswith("warning: ") and "no longer mounts buckets" in warning
    assert "gs://BUCKET/PATH" in warning and "gs://b/runs/x" in warning

    # A local path is kept, with the warning that it is each worker's own disk.
    local, workdir = run_workdir("runs/x")
    assert workdir == "runs/x"
    (warning,) = local.stderr.strip().splitlines()
    assert warning.startswith("warning: ") and "each worker's own disk" in warning

    for bad in ("gs://", "gs:///runs/x", "gs://b/../../etc", "gs://b/runs/../x", "gs://B/x"):
        result = launcher("run", "--dry-run", *POD, "--config", "configs/tiny.py",
                          "--workdir", bad)
        assert result.returncode == 2
        one_line_error(result, "not a bucket path")


def test_logs_follows_worker_0_until_training_ends(tmp_path):
    (ssh,) = dry_run("logs", *POD)
    assert "--worker=0" in ssh
    (ssh3,) = dry_run("logs", *POD, "--worker", "3")
    assert "--worker=3" in ssh3

    home = tmp_path / "home"
    home.mkdir()
    (home / "train.log").write_text("step 10/100  loss 7.1\n")
    trainer = subprocess.Popen(["sleep", "1"])
    (home / "train.pid").write_text(f"{trainer.pid}\n")
    follower = subprocess.Popen(["bash", "-c", remote_script(ssh)],
                                env={"HOME": str(home), "PATH": tools_path()},
                                stdout=subprocess.PIPE, text=True)
    trainer.wait()  # reaped: tail --pid sees it gone
    out, _ = follower.communicate(timeout=20)  # returns by itself: `all` can go on to delete
    assert follower.returncode == 0 and "step 10/100" in out


# --- bad input, no gcloud, failing commands -------------------------------------------------

@pytest.mark.parametrize("command", ["run", "all"])
def test_missing_config_is_one_line_exit_2(command):
    result = launcher(command, *POD, "--config", "configs/nope.py",
                      "--workdir", "gs://b/r", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "configs/nope.py", "does not exist")


def test_config_outside_the_repository_is_refused(tmp_path):
    config = tmp_path / "mine.py"
    config.write_text("")
    result = launcher("run", *POD, "--config", str(config), "--workdir", "gs://b/r", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "outside")


@pytest.mark.parametrize("name", ["RS-v4", "rs_v4", "4rs", "rs-", "r" * 64])
def test_bad_tpu_name_is_refused(name):
    result = launcher("delete", "--name", name, "--zone", "z", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "not a valid TPU name")


@pytest.mark.parametrize("accelerator,expected", [
    ("foo", "--accelerator-type='foo' is not a TPU slice name: use one of v4-N"),
    ("v4-12", "--accelerator-type=v4-12: 12 cores is not a v4 slice"),
    ("v5litepod-2", "--accelerator-type=v5litepod-2: 2 cores is not a v5litepod slice"),
])
def test_an_accelerator_type_that_is_not_a_slice_is_refused(accelerator, expected):
    result = launcher("create", *POD, "--accelerator-type", accelerator, "--dry-run")
    assert result.returncode == 2
    one_line_error(result, expected)


def test_a_single_chip_slice_is_created():
    (cmd,) = dry_run("create", *POD, "--accelerator-type", "v6e-1")
    assert "--accelerator-type=v6e-1" in cmd


def test_overrides_must_be_flags():
    result = launcher("run", *POD, *TRAIN, "--dry-run", "--", "config.num_train_steps=100")
    assert result.returncode == 2
    one_line_error(result, "config.num_train_steps=100")
    assert launcher("delete", *POD, "--dry-run", "--", "--config.x=1").returncode == 2


def test_no_gcloud_without_dry_run_is_an_error():
    assert shutil.which("gcloud", path=tools_path()) is None
    result = launcher("all", *POD, *TRAIN)
    assert result.returncode != 0
    one_line_error(result, "gcloud", "Google Cloud SDK", "--dry-run")
    assert launcher("all", "--dry-run", *POD, *TRAIN).returncode == 0


def test_dry_run_after_the_separator_is_refused():
    result = launcher("all", *POD, *TRAIN, "--", "--config.num_train_steps=100", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "--dry-run", "before")


def fake_gcloud(tmp_path, fail_on: str, code: int = 7):
    """A gcloud on PATH that logs its calls and exits `code` when its args contain fail_on."""
    log = tmp_path / "gcloud.log"
    write_executable(tmp_path / "bin" / "gcloud", f"""#!/bin/bash
echo "$*" >> {shlex.quote(str(log))}
case " $* " in *" {fail_on} "*) exit {code};; esac
""")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{tools_path()}",
           "TMPDIR": str(tmp_path)}
    return env, log


def test_stops_at_the_first_failing_command(tmp_path):
    env, log = fake_gcloud(tmp_path, fail_on="create")
    result = launcher("create", *POD, env=env)
    assert result.returncode == 1
    assert result.stdout.startswith("+ gcloud compute tpus tpu-vm create rs-v4")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "exited with code 7" in lines[0] and "create rs-v4" in lines[0]
    assert len(log.read_text().splitlines()) == 1


def test_all_stops_after_a_failure_and_says_how_to_delete(tmp_path):
    env, log = fake_gcloud(tmp_path, fail_on="scp")
    result = launcher("all", *POD, *TRAIN, "--skip-compile-check", env=env)
    assert result.returncode == 1
    assert [line.split()[3] for line in log.read_text().splitlines()] == ["create", "scp"]
    (line,) = result.stderr.strip().splitlines()  # a gs:// workdir: no warning, the failure only
    assert "exited with code 7" in line
    assert "gcloud compute tpus tpu-vm delete rs-v4 --quiet --zone=us-central2-b" in line


def test_run_and_all_check_the_compile_for_the_slice_first():
    (check, *_) = dry_run("all", *POD, *TRAIN, "--accelerator-type", "v4-8", "--",
                          "--config.mesh.seq=4", compile_check=True)
    assert check[1:] == [str(REPO / "scripts" / "plan.py"), "--config=configs/tiny.py",
                         "--compile=tpu", "--topology=v4-8", "--config.mesh.seq=4"]
    assert verb(dry_run("run", *POD, *TRAIN, compile_check=True)[0]) == "compile-check"
    assert dry_run("all", *POD, *TRAIN, "--skip-compile-check", compile_check=True)[0][4] == (
        "create")


@pytest.mark.programs
def test_all_stops_before_creating_a_slice_the_step_does_not_fit(tmp_path):
    """The TPU compiler, here, refuses tiny.py with 4,096 rows per step on a v4-8: one line,
    exit 1, and gcloud is never called."""
    env, log = fake_gcloud(tmp_path, fail_on="nothing")
    result = launcher("all", *POD, *TRAIN, "--accelerator-type", "v4-8",
                      "--", "--config.mesh.data=1", "--config.mesh.seq=4", "--config.seq_len=4096",
                      "--config.data.eval_fraction=0.05", "--config.global_batch_size=4096",
                      "--config.data.max_bytes=0", env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: compile check for v4-8: the TPU compiler refused") and (
        "HBM" in line and "--skip-compile-check" in line)
    assert not log.exists()  # no slice created, nothing started
