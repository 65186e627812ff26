"""The `placebench profile` and `placebench fidelity` commands (wired into `suite.cli` by `add_commands`).

    placebench profile WORKLOAD --device cpu [--out DIR] [--threads N] [--set KEY=VALUE] [--mode MODE]
    placebench fidelity WORKLOAD [--cluster FILE] [--map DEV=TORCH] [--backend torch|onnxruntime] [--out DIR]

WORKLOAD is a zoo name; `--set batch_size=1` (repeatable, JSON values) builds a shape variant and `--mode
inference` an inference step of a training workload (see `suite.backends.workload`). `--threads` sets
torch's (and ONNX Runtime's) intra-op threads; the default, 1, is the most reproducible on a shared
machine (0: the library default); `--clock cpu` times CPU-only runs in CPU time, which other processes'
load does not inflate (see `suite.backends.timing`). Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from suite.errors import PlacebenchError

DEFAULT_PLACERS = ("human_expert", "metis", "m_etf")  # baselines of the fidelity set (where they apply)


def _overrides(items: list[str]) -> dict[str, Any]:
    from suite.cli import option_value

    out: dict[str, Any] = {}
    for text in items:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PlacebenchError(f"--set {text!r}: expected KEY=VALUE (for example batch_size=1)")
        if key == "mode":
            raise PlacebenchError(f"--set {text!r}: the step (inference or training) is chosen with --mode, "
                                  "not --set")
        if key in out:
            raise PlacebenchError(f"--set {key} is given twice")
        out[key] = option_value(raw, f"--set {key}")
    return out


def _workload(args: argparse.Namespace):
    from suite import zoo
    from suite.backends.workload import real_workload

    if args.workload not in zoo.names() and ("/" in args.workload or Path(args.workload).is_file()):
        raise PlacebenchError(f"{args.workload}: {args.command} runs a model, so it needs a zoo workload name "
                              f"(placebench list workloads), not a graph file")
    return real_workload(args.workload, seed=args.seed, mode=args.mode, **_overrides(args.set))


def cmd_profile(args: argparse.Namespace) -> int:
    from suite import methodology as _m
    from suite.cli import UsageError, check_output_dir, refuse_store_dir
    from suite.profiling import DEFAULT_DIR, profile_path, profile_workload

    if args.applies_to is not None and not args.applies_to.strip():
        raise UsageError("--applies-to is empty: give a device name, kind or model (or leave it out: the kind)")
    refuse_store_dir(args.out or DEFAULT_DIR, "--out", "profiles")
    check_output_dir(args.out or DEFAULT_DIR, "--out")  # before measuring, which takes minutes
    rw = _workload(args)
    meth = _m.load(args.methodology)
    target = profile_path(args.out or DEFAULT_DIR, rw.graph.name, args.device)
    if target.exists() and not args.force:  # checked before measuring: a stored profile is a measurement too
        raise UsageError(f"{target} exists (a stored profile); pass --force to measure and replace it, or --out DIR")
    prof = profile_workload(rw, args.device, methodology=meth, applies_to=args.applies_to,
                            threads=args.threads, calibrate=not args.no_calibrate, clock=args.clock)
    path = prof.save(target)
    c = prof.metadata["calibration"]
    summary = {"workload": rw.graph.name, "device": args.device, "applies_to": prof.applies_to, "path": str(path),
               "ops": len(prof.op_times_s), "threads": prof.metadata["threads"],
               "raw_sum_s": c["raw_sum_s"], "measured_step_s": c["measured_step_s"], "calibration": c.get("method")}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    top = sorted(prof.op_times_s.items(), key=lambda kv: -kv[1])[:5]
    print(f"profiled {rw.graph.name} on {args.device} ({summary['threads']} thread(s)): {len(prof.op_times_s)} ops; "
          f"applies to every cluster device whose name, kind or model is {prof.applies_to!r}")
    print(f"sum of op times {c['raw_sum_s'] * 1e3:.3f} ms, measured step {c['measured_step_s'] * 1e3:.3f} ms, "
          f"calibration {c.get('method')}")
    print("slowest ops: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in top))
    print(f"wrote {path}")
    return 0


def _cluster_and_map(args: argparse.Namespace):
    import torch

    from suite.backends.devices import DeviceMap, local_cluster

    if args.cluster:
        import suite

        cluster = suite.load_cluster(args.cluster)
        return cluster, DeviceMap.parse(cluster, args.map)
    logical = args.logical_cpus if args.logical_cpus is not None else (1 if torch.cuda.is_available() else 2)
    cluster, dmap = local_cluster(logical, measure=True)
    if args.map:
        dmap = DeviceMap.parse(cluster, args.map)
    return cluster, dmap


def profiles_for(rw: Any, cluster: Any, dmap: Any, directory: Path, *, threads: int, methodology: Any,
                 clock: str = "wall", log: Any = print, reprofile: bool = False) -> list[Any]:
    """One profile per torch device used by the cluster (stored, or measured now and stored), each applied to
    the cluster devices mapped to that torch device (`applies_to` = the cluster device's name).

    A stored profile is a measurement: it is replaced only with `reprofile`. One that is damaged, covers
    not every op, or was measured with other settings or on another machine is an error naming what
    differs, as `placebench profile` refuses to measure over a stored profile without --force.
    """
    from suite.costmodel import load_profile
    from suite.errors import ProfileError
    from suite.profiling import profile_path, profile_workload
    from suite.store import check_writable

    hint = "pass --reprofile to measure it again and replace it, or --profiles DIR to keep it"
    tdevs = list(dict.fromkeys(dmap.torch_devices))
    if reprofile or not all(profile_path(directory, rw.graph.name, t).exists() for t in tdevs):
        try:  # a profile will be measured and stored there: checked before the first measurement
            check_writable(directory, directory=True)
        except OSError as exc:
            raise PlacebenchError(f"--profiles: {exc.strerror}") from None
    out = []
    for tdev in tdevs:
        path = profile_path(directory, rw.graph.name, tdev)
        prof = None
        if path.exists() and not reprofile:
            try:
                prof = load_profile(path)
            except ProfileError as exc:  # a damaged profile is reported, never silently measured over
                raise ProfileError(f"{exc} (fix or delete it, or pass --reprofile to measure it again)") from None
            differs = _profile_differences(prof, rw.graph, tdev, threads, clock)
            if differs:
                raise ProfileError(f"{path}: stored profile {'; '.join(differs)}: {hint}")
            log(f"using the stored profile {path} (measured {prof.metadata.get('measured_at', '?')} on "
                f"{prof.metadata.get('machine', '?')})")
        if prof is None:
            log(f"profiling {rw.graph.name} on {tdev} ...")
            prof = profile_workload(rw, tdev, methodology=methodology, threads=threads, clock=clock)
            prof.save(path)
            prof = replace(prof, source=str(path))
        for name, t in zip(dmap.cluster_devices, dmap.torch_devices, strict=True):
            if t == tdev:
                out.append(replace(prof, applies_to=name))
    return out


def _profile_differences(prof: Any, graph: Any, device: str, threads: int, clock: str) -> list[str]:
    """How a stored profile differs from what this run would measure (empty when it can be used)."""
    import platform

    meta = prof.metadata
    out = []
    if prof.workload_hash != graph.content_hash:
        out.append(f"was measured on graph {prof.workload_hash or '(no hash)'}, not {graph.content_hash}")
    for key, want in (("device", device), ("threads", threads), ("clock", clock), ("machine", platform.node())):
        got = meta.get(key, "wall" if key == "clock" else None)
        if got != want:
            out.append(f"has {key} {got!r}, this run {want!r}")
    calibration = meta.get("calibration")
    if isinstance(calibration, dict) and calibration.get("method") == "none":
        out.append("is not calibrated (placebench profile --no-calibrate), this run calibrates")
    missing = [op.name for op in graph.ops if op.name not in prof.op_times_s]
    if missing:
        out.append(f"covers {graph.num_ops - len(missing)} of {graph.num_ops} ops (missing {', '.join(missing[:3])}"
                   + (", ..." if len(missing) > 3 else "") + ")")
    return out


def _profile_backends(rw: Any, dmap: Any, directory: Path, reprofile: bool) -> list[str | None]:
    """The backend of each profile `profiles_for` will give, read before it profiles: a stored one's recorded
    backend (`measured_backend`: None where unknown, a profile written by hand), "torch" for one it will
    measure (`profile_workload`). A stored profile that cannot be read is left to `profiles_for` to report."""
    from suite.costmodel import load_profile
    from suite.errors import ProfileError
    from suite.profiling import measured_backend, profile_path

    out: list[str | None] = []
    for tdev in dict.fromkeys(dmap.torch_devices):
        path = profile_path(directory, rw.graph.name, tdev)
        if reprofile or not path.exists():
            out.append("torch")
            continue
        try:
            out.append(measured_backend(load_profile(path)))
        except ProfileError:
            continue
    return out


def _backend_warning(backend: str, backends: list[str | None]) -> str:
    """What the study is told before profiling of its profiles' backends (`_profile_backends`): those of
    another backend (`fidelity.backend_mismatch`), and how many record none ("" when all are `backend`'s)."""
    from suite.fidelity import backend_mismatch

    known = backend_mismatch(backend, backends)
    unknown = sum(b is None for b in backends)
    if not unknown:
        return known
    note = (f"{unknown} of {len(backends)} profile(s) record no backend (metadata.backend; written by hand?): "
            f"the backend they were measured on is unknown, maybe not {backend}")
    return f"{known}; {note}" if known else note


def cmd_fidelity(args: argparse.Namespace) -> int:
    import torch

    from suite.backends import check_available

    check_available(args.backend, f"--backend {args.backend}")
    before = torch.get_num_threads()
    try:
        return _fidelity(args)
    finally:
        torch.set_num_threads(before)


def _fidelity(args: argparse.Namespace) -> int:
    from suite import fidelity
    from suite import methodology as _m
    from suite.cli import UsageError, _write, check_output_dir, refuse_store_dir
    from suite.profiling import DEFAULT_DIR as PROFILE_DIR
    from suite.profiling import set_threads

    profiles = Path(args.profiles or PROFILE_DIR)
    if profiles.exists() and not profiles.is_dir():  # read, or written where a profile is missing: never a file
        raise UsageError(f"--profiles {profiles} is a file, not a directory")
    refuse_store_dir(profiles, "--profiles", "profiles")
    refuse_store_dir(args.out or fidelity.DEFAULT_DIR, "--out", "reports")
    check_output_dir(args.out or fidelity.DEFAULT_DIR, "--out")  # before profiling and measuring

    if "none" in args.placer and len(args.placer) > 1:
        raise UsageError(f"--placer none (no baseline) cannot be combined with other placers: {args.placer}")
    if args.cluster and args.logical_cpus is not None:
        raise UsageError("--logical-cpus describes this machine's cluster: it cannot be combined with --cluster")
    fidelity.check_placers([] if args.placer == ["none"] else args.placer)  # a typo fails before anything runs
    threads = set_threads(args.threads)
    meth = _m.load(args.methodology)
    rw = _workload(args)
    if args.backend == "onnxruntime":  # before profiling, which takes minutes and stores profiles
        from suite.backends.ort_exec import check_inference

        check_inference(rw)
    cluster, dmap = _cluster_and_map(args)
    concurrent = {"auto": "auto", "on": True, "off": False}[args.concurrent]
    fidelity.check_clock(args.clock, cluster, dmap, backend=args.backend, concurrent=concurrent)  # before profiling
    if not args.force:  # a report of the same name measured with other settings: before profiling
        settings = fidelity.report_settings(args.backend, args.rounds, concurrent, threads, meth.timing)
        stem = fidelity.report_stem(rw.graph.name, cluster.name, args.backend, args.clock, settings["concurrent"])
        names = fidelity.report_names(rw.graph.name, cluster.name, args.backend, args.clock)
        fidelity.check_replace(Path(args.out or fidelity.DEFAULT_DIR) / f"{stem}.json", settings, names)
    # progress through the CLI's _write: a reader that left (`| head`) does not stop the measurements and report
    log = (lambda *a: None) if args.json else (lambda text: _write(sys.stdout, text + "\n"))
    # profiles of another backend than the study's: said before profiling, which takes minutes, not after
    early = _backend_warning(args.backend, _profile_backends(rw, dmap, profiles, args.reprofile))
    if early:
        _write(sys.stderr, f"placebench: warning: fidelity of {rw.graph.name}: {early}\n")
    profs = profiles_for(rw, cluster, dmap, profiles, threads=threads, methodology=meth,
                         clock=args.clock, log=log, reprofile=args.reprofile)

    def progress(row):
        err = "-" if row.rel_error is None else f"{row.rel_error * 100:+.1f}%"
        pred = "-" if row.predicted_s is None else f"{row.predicted_s * 1e3:.2f}"
        meas = "-" if row.measured_s is None else f"{row.measured_s * 1e3:.2f}"
        log(f"  {row.label:<22} predicted {pred:>9} ms  measured {meas:>9} ms  {err:>8}  {row.status}"
            + (f": {row.message}" if row.message and row.status != "ok" else ""))

    placers = args.placer or list(DEFAULT_PLACERS) + (["ort_gpu"] if cluster.device_indices("gpu") else [])
    if placers == ["none"]:
        placers = []
    result = fidelity.run_fidelity(rw, cluster, dmap, profs, backend=args.backend, methodology=meth,
                                   n_split=args.splits, n_random=args.random, seed=args.seed, placers=placers,
                                   rounds=args.rounds, clock=args.clock, concurrent=concurrent, progress=progress,
                                   warn_backend=False)  # said above, before profiling
    paths = fidelity.write_report(result, args.out or fidelity.DEFAULT_DIR, png=not args.no_png, force=args.force)
    if args.json:
        print(json.dumps({**result.to_dict(), "paths": {k: str(v) for k, v in paths.items()}}, indent=1))
        return 0
    s = result.stats()
    med, rho = s["median_abs_rel_error"], s["spearman"]
    print(f"median |relative error| {'-' if med is None else f'{med * 100:.1f}%'}, "
          f"Spearman {'-' if rho is None else f'{rho:.3f}'}, {s['within_15pct']}/{s['measured_ok']} within 15%")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    from suite.cli import SEED, whole_number

    p.add_argument("workload", help="zoo workload name")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="shape override of the workload (JSON value), e.g. batch_size=1; repeatable")
    p.add_argument("--mode", choices=("inference", "training"), help="step to run (default: the workload's)")
    p.add_argument("--threads", type=whole_number(0, 4097), default=1,  # suite.profiling.MAX_THREADS = 4096
                   help="intra-op threads, at most 4096 (default 1; 0: library default)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the weights, inputs and random placements")
    p.add_argument("--methodology", default="v1", help="methodology name or file (timing protocol)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time (default) or this process's CPU time (one-thread CPU runs on a shared machine)")
    p.add_argument("--json", action="store_true")


def add_commands(sub: Any) -> None:
    """Add `profile` and `fidelity` to the CLI's subparsers."""
    from suite.cli import whole_number

    pr = sub.add_parser("profile", help="measure per-op times of a workload on a device of this machine")
    _common(pr)
    pr.add_argument("--device", default="cpu", help="torch device: cpu or cuda:N (default cpu)")
    pr.add_argument("--out", help="profile directory (default: results/profiles)")
    pr.add_argument("--applies-to", help="device name, kind or model the profile applies to (default: the kind)")
    pr.add_argument("--no-calibrate", action="store_true", help="raw op times, no per-op overhead calibration")
    pr.add_argument("--force", action="store_true", help="replace a stored profile of the same workload and device")
    pr.set_defaults(func=cmd_profile)

    fi = sub.add_parser("fidelity", help="simulator vs real execution on a set of placements (table + PNG)")
    _common(fi)
    fi.add_argument("--cluster", "-c", help="cluster preset or file (default: this machine; without a GPU, 2 logical CPUs)")
    fi.add_argument("--map", action="append", default=[], metavar="DEV=TORCH",
                    help="map a cluster device to a torch device, e.g. gpu:0=cpu (default: cpu -> cpu, k-th gpu -> cuda:k)")
    fi.add_argument("--logical-cpus", type=whole_number(1), help="logical CPU devices of this machine's cluster")
    fi.add_argument("--backend", choices=("torch", "onnxruntime"), default="torch")
    fi.add_argument("--profiles", help="profile directory (default: results/profiles); missing profiles are measured")
    fi.add_argument("--reprofile", action="store_true",
                    help="measure the profiles again now (a stored profile may be from another load of the machine)")
    fi.add_argument("--out", help="report directory (default: results/fidelity)")
    fi.add_argument("--splits", type=whole_number(0), default=3, help="random contiguous splits (default 3)")
    fi.add_argument("--random", type=whole_number(0), default=2, help="random per-op placements (default 2)")
    fi.add_argument("--concurrent", choices=("auto", "on", "off"), default="auto",
                    help="one thread per device (on), one thread for all (off), or on only across torch devices (auto)")
    fi.add_argument("--rounds", type=whole_number(1), default=3, help="interleaved measurement rounds per placement (default 3)")
    fi.add_argument("--placer", action="append", default=[],
                    help="a registered placer's placement to include (repeatable; default: "
                         f"{', '.join(DEFAULT_PLACERS)}, and ort_gpu with a GPU; 'none': no baseline)")
    fi.add_argument("--no-png", action="store_true")
    fi.add_argument("--force", action="store_true",
                    help="replace a report of the same file name of other names (workload, cluster, backend, clock) "
                         "or measured with other settings (rounds, concurrent, threads, timing)")
    fi.set_defaults(func=cmd_fidelity)
