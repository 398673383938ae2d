"""The command line of ``hpcgpu plan``: its options, and the table or JSON lines it prints.

``hpcgpu plan weather --nx 4096 --ny 4096 --device h100`` prints the
prediction of :func:`hpcgpu.plan.plan`; ``hpcgpu plan --check`` runs the
comparison of :mod:`hpcgpu.plan.check` on this machine.
"""

import json

from hpcgpu.errors import ConfigError
from hpcgpu.plan.prediction import EFFICIENCY_THRESHOLD, plan
from hpcgpu.plan.profiles import DEVICES, EPOCH_OVERHEAD_S, LINKS, TASK_OVERHEAD_S, SchedulerModel, link_profile
from hpcgpu.validation import check_float

__all__ = ["add_arguments", "run_command"]


def _declared_options():
    """``{name: PlanOption}``: the options the registered workloads' cost models take (first declaration wins)."""
    from hpcgpu import registry

    options = {}
    for declared in registry.plan_workloads().values():
        for option in declared.plan_options:
            options.setdefault(option.name, option)
    return options


def add_arguments(parser):
    """Add the options of ``hpcgpu plan`` to an argparse parser (each workload declares its own)."""
    from hpcgpu import registry

    names = ", ".join(registry.plan_workloads())
    parser.add_argument("workload", nargs="?", help=f"one of {names} (weather with --check)")
    size = parser.add_argument_group("problem")
    size.add_argument("--steps", type=float, default=1000, help="time steps to solution (default 1000)")
    size.add_argument("--dtype", help="float32 or float64 (default: the workload's; float32 for most)")
    for option in _declared_options().values():
        if option.type is bool:
            size.add_argument(option.flag, action="store_true", help=option.help)
        else:
            size.add_argument(option.flag, type=option.type, help=option.help)
    machine = parser.add_argument_group("machine")
    machine.add_argument("--device", default="h100",
                         help=f"one of {', '.join(DEVICES)}, or a .jsonl file of `hpcgpu bench` results "
                              "(default h100)")
    machine.add_argument("--memory-gb", type=float, help="device memory (GB), overriding the profile's")
    machine.add_argument("--interconnect", default="ndr",
                         help=f"one of {', '.join(LINKS)} (default ndr: NCCL over InfiniBand NDR)")
    machine.add_argument("--link-gbs", type=float,
                         help="interconnect bandwidth per direction (GB/s), overriding (e.g. from `hpcgpu bench comm`)")
    machine.add_argument("--link-latency-us", type=float,
                         help="latency per message, one way (us), overriding (e.g. from `hpcgpu bench comm`)")
    machine.add_argument("--max-gpus", type=int, default=64, help="largest GPU count (default 64)")
    machine.add_argument("--epoch-overhead-ms", type=float, default=EPOCH_OVERHEAD_S * 1e3,
                         help="scheduler round trips per epoch in ms (default 2)")
    machine.add_argument("--task-overhead-ms", type=float, default=TASK_OVERHEAD_S * 1e3,
                         help="scheduler work per task of an epoch (P + 1 tasks) in ms (default 0.2)")
    machine.add_argument("--efficiency-threshold", type=float, default=EFFICIENCY_THRESHOLD,
                         help="warn below this parallel efficiency (default 0.5)")
    parser.add_argument("--check", action="store_true",
                        help="compare the model with a run on this machine (weather on 1 and 2 local workers)")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def run_command(args):
    """Run ``hpcgpu plan`` from parsed arguments; returns the exit status."""
    if args.check:
        return _run_check(args)
    from hpcgpu import registry

    if args.workload is None:
        names = ", ".join(repr(w) for w in registry.plan_workloads())
        raise ConfigError(f"workload must be one of {names}; got none (or give --check)")
    options = _declared_options()
    size = {k: getattr(args, k, None) for k in ("steps", "dtype", *options)}
    size = {k: v for k, v in size.items() if v is not None}
    for name, option in options.items():
        if option.type is bool and not size.get(name):
            size.pop(name, None)  # a flag's absence is the model's default
    for key in ("steps", *(name for name, option in options.items() if option.count)):
        if key in size and float(size[key]).is_integer():
            size[key] = int(size[key])
    epoch = check_float("epoch_overhead_ms", args.epoch_overhead_ms, minimum=0.0)
    task = check_float("task_overhead_ms", args.task_overhead_ms, minimum=0.0)
    scheduler = SchedulerModel()
    if (epoch, task) != (EPOCH_OVERHEAD_S * 1e3, TASK_OVERHEAD_S * 1e3):
        scheduler = SchedulerModel(epoch * 1e-3, task * 1e-3,
                                   source=f"given: {epoch:g} ms per epoch, {task:g} ms per task")
    link = link_profile(args.interconnect, bandwidth_gbs=args.link_gbs, latency_us=args.link_latency_us)
    result = plan(args.workload, device=args.device, interconnect=link, max_gpus=args.max_gpus,
                  scheduler=scheduler,
                  efficiency_threshold=args.efficiency_threshold, memory_gb=args.memory_gb, **size)
    print(result.json_lines() if args.json else result.table())
    return 0


def _run_check(args):
    from hpcgpu.plan.check import check_against_this_machine, format_check

    if args.workload not in (None, "weather"):
        raise ConfigError(f"workload must be 'weather' with --check; got {args.workload!r}")
    # ``is not None``, not truthiness: ``--nx 0`` must be refused, not replaced by the default
    options = {k: getattr(args, k) for k in ("nx", "ny", "steps_per_task", "dtype") if getattr(args, k) is not None}
    result = check_against_this_machine(**options)
    if args.json:
        for row in result["rows"]:
            print(json.dumps({"kind": "check", **{k: v for k, v in result.items() if k != "rows"}, **row}))
    else:
        print(format_check(result))
    return 0
