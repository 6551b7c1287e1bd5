"""For the scripts tests run in several processes under scripts/launch_local.py
(tests/support/two_process_*.py): launch_local's flags parsed beside the script's own, the fake device
count set, and the processes joined."""


def join(parser, devices_per_process: int):
    """The parsed arguments, once this process has joined the others (jax.distributed)."""
    for flag in ("--coordinator_address", "--num_processes", "--process_id"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    import jax
    jax.config.update("jax_num_cpu_devices", devices_per_process)
    jax.distributed.initialize(args.coordinator_address, num_processes=int(args.num_processes),
                               process_id=int(args.process_id))
    return args
