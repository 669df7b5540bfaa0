"""Benchmark: each method's training throughput (images/s) in fp32 and bf16, with one job and with N jobs sharing the device.

The arms are the studies' own configurations (`dml_book.study_design.study_spec`): each method's main arm (`ala`,
`hdml`, `dcml`, `pads`, `dmml`, from the study of that name) and one baseline. The studies' baselines are not one
configuration (the HDML baseline is HDML's trainer with a squared triplet loss of margin 1.0 and no synthesis, the
DMML baseline is episodes with batch-hard mining, ...), so `baseline` is the DCML study's: the plain trainer
(`method="baseline"`, triplet loss); `--arms baseline:hdml` (or `:ala`, `:pads`, `:dmml`, `:dcml`) adds a study's own.
Each arm keeps every study setting (glyphs-XL, smallcnn, batch 64, channels-last, ...) except `precision` (each of
`--precisions`), `device`, and `num_workers=0` (the batches are loaded before the clock starts).

One (arm, precision) measurement: a `Trainer` (built once per process, before any timing), `--warmup` + `--steps`
batches pulled from its loader and moved to the device first (one set per arm, shared by its precisions), `--warmup`
untimed `Trainer.training_step`s, then `--steps` timed ones by wall clock (`torch.cuda.synchronize()` before the
clock is read on CUDA). images/s = images in the timed batches / seconds. CPU seconds are the process's own (user +
system, all its threads) over the timed window.

Jobs: for each N of `--jobs`, N fresh processes (spawn) each build the same trainers, then, before each timed window,
wait at one barrier, so the N windows overlap. The N-job figure is the sum of the N processes' images/s (`total`; and
`per_job`, its mean; `aggregate` in the JSON: all images / the span from the first start to the last end). Each
process runs `--threads` torch threads (default 1). Start-up (imports, rendering the dataset, building trainers) is
outside the timed windows; each phase's wall time goes to stderr. An arm that fails to build or step is reported in one
line and skipped; a process that dies or hangs breaks the barrier (abort, or `--barrier-timeout`) instead of holding
the others.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/throughput.py --device cpu --jobs 1 2 --steps 5 --warmup 2 \\
        --out benchmarks/results/throughput_cpu.json                                  # about 4 minutes on 2 cores
    python benchmarks/throughput.py --jobs 1 8 --out benchmarks/results/throughput_h100.json \\
        --against benchmarks/results/throughput_cpu.json                              # a GPU with 16 CPU cores

    .venv/bin/python benchmarks/throughput.py --table benchmarks/results/throughput_h100.json \\
        --against benchmarks/results/throughput_cpu.json                              # re-print stored runs, nothing measured

`--against FILE.json` adds, per arm, precision and jobs, this run / that stored run: a ratio across machines compares
two stored runs (each measured on its own machine, with its own torch), not one side-by-side measurement.
`--table FILE.json` prints a stored run's table instead of measuring (`--table F --against F`: every ratio 1.00).
On a CPU without bf16 units (no AMX/AVX512-BF16: `grep -oE 'amx_bf16|avx512_bf16' /proc/cpuinfo`) bf16 is emulated and
far slower than fp32 (see `benchmarks/precision.py`); it is measured all the same.

Measured (`benchmarks/results/throughput_cpu.json`, the first command above, 243 s): a 2-core AMD EPYC without bf16
units, torch 2.14.1, 1 thread per job: fp32 267-365 images/s at one job (hdml slowest, dmml fastest), 1.8-2.2x that
with two jobs on the two cores; bf16 (emulated) 0.08-0.14x fp32. Five timed steps: the figures move by about 10%
between runs.

Measured on an NVIDIA H200 (`benchmarks/results/throughput_h200.json`: `--jobs 1 8 --steps 10 --warmup 3`, torch
2.11.0+cu130, 16 CPU cores, 48 s in all), images/s summed over the jobs:

| arm | fp32, 1 job | bf16, 1 job | fp32, 8 jobs | bf16, 8 jobs | 8 jobs / 1 (fp32) | H200 / CPU core (fp32, 1 job) |
|---|---|---|---|---|---|---|
| baseline | 11,390 | 10,133 | 41,350 | 42,311 | 3.6 | 36 |
| ala | 2,630 | 2,358 | 8,534 | 8,465 | 3.2 | 9.2 |
| hdml | 3,568 | 3,493 | 11,155 | 10,979 | 3.1 | 13 |
| dcml | 2,354 | 2,384 | 10,449 | 10,354 | 4.4 | 7.3 |
| pads | 5,987 | 5,890 | 18,313 | 18,726 | 3.1 | 18 |
| dmml | 7,242 | 5,902 | 18,328 | 18,330 | 2.5 | 20 |

- bf16 buys nothing here (0.8-1.0x fp32 at one job): the study's network (smallcnn, 32x32 glyphs, batch 64) is too
  small for the tensor cores to matter; a step is bound by Python and kernel launches, not arithmetic.
- Several jobs on one GPU pay: 2.5-4.4x the images/s with 8 jobs, which is why `dml-book tune --jobs N` runs one
  process per job. The tuning of HDML, ALA, PADS and DMML ran that way on this H200 (two studies at once, 7 jobs each):
  40 trials of 10 epochs per study in 4-5.5 minutes of wall time.
- The H200 / CPU ratios compare two stored runs (one CPU core, torch 2.14.1, above).
"""
import argparse, json, os, platform, queue, resource, sys, time, warnings

STUDIES = ("ala", "hdml", "dcml", "pads", "dmml")
BASELINE_FROM = "dcml"   # `baseline`: the DCML study's baseline, the plain trainer (method "baseline")
ARMS = ("baseline", *STUDIES)
ALL_ARMS = ARMS + tuple(f"baseline:{s}" for s in STUDIES)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"): return line.split(":", 1)[1].strip()
    except OSError: pass
    return platform.processor() or platform.machine()


def arm_config(arm: str):
    "The `TrainConfig` of `arm`: a study's main arm (named as the study), `baseline` or `baseline:<study>`."
    from dml_book.study_design import study_spec
    if arm == "baseline": arm = f"baseline:{BASELINE_FROM}"
    if arm.startswith("baseline:"):
        s = study_spec(arm.split(":", 1)[1]); return s.arms[s.baseline]
    return study_spec(arm).arms[arm]


def worker(rank: int, args, device: str, barrier, q):
    "One job: build every (arm, precision) trainer, then time each after the barrier; results go to `q` as they come."
    t0 = time.perf_counter()
    try:
        warnings.filterwarnings("ignore")
        import tempfile
        from dataclasses import replace
        import torch
        torch.set_num_threads(args.threads)
        from dml_book.train import Trainer, bf16_units
        dev = torch.device(device)
        cuda = dev.type == "cuda"
        if cuda: torch.cuda.set_device(dev.index or 0)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        q.put(("meta", rank, dict(torch=torch.__version__, python=platform.python_version(), threads=torch.get_num_threads(),
                                  device=torch.cuda.get_device_name() if cuda else cpu_model(), bf16_units=bf16_units(dev))))
        t1 = time.perf_counter(); q.put(("phase", rank, "imports", t1 - t0))
        tmp = tempfile.TemporaryDirectory()
        trainers, batches, errors, n = {}, {}, {}, args.warmup + args.steps
        for arm in args.arms:
            try: cfg = arm_config(arm)
            except Exception as e:
                for p in args.precisions: errors[arm, p] = f"config: {one_line(e)}"
                continue
            for p in args.precisions:
                try:
                    t = Trainer(replace(cfg, out=f"{tmp.name}/{arm.replace(':', '_')}-{p}", precision=p, device=device, num_workers=0))
                    if arm not in batches:
                        got = []
                        while len(got) < n:
                            before = len(got)
                            for x, y in t.loader:
                                got.append((x.to(dev), y.to(dev)))
                                if len(got) == n: break
                            if len(got) == before: raise RuntimeError("the training loader yields no batches")
                        batches[arm] = got
                    trainers[arm, p] = t
                except Exception as e: errors[arm, p] = f"build: {one_line(e)}"
        sync()
        q.put(("phase", rank, f"setup ({len(trainers)} trainers)", time.perf_counter() - t1))
        t2 = time.perf_counter()
        for arm in args.arms:
            for p in args.precisions:
                t = trainers.pop((arm, p), None)   # dropped after its measurement: memory for the others
                err = errors.get((arm, p))
                if err is None:
                    try:
                        for x, y in batches[arm][:args.warmup]: t.training_step(x, y)
                        sync()
                    except Exception as e: err = f"warm-up step: {one_line(e)}"
                barrier.wait()   # every job passes here, failed or not, so the timed windows start together
                if err is None:
                    try:
                        timed = batches[arm][args.warmup:]
                        c, s = cpu(), time.perf_counter(); start = time.monotonic()
                        for x, y in timed: t.training_step(x, y)
                        sync()
                        sec, end = time.perf_counter() - s, time.monotonic()
                        images = sum(int(x.shape[0]) for x, _ in timed)
                        q.put(("row", rank, arm, p, dict(images=images, seconds=sec, cpu_s=cpu() - c, start=start, end=end,
                                                         batch_size=int(timed[0][0].shape[0]))))
                    except Exception as e: err = f"step: {one_line(e)}"
                if err is not None: q.put(("error", rank, arm, p, err))
                del t
                if cuda: torch.cuda.empty_cache()
            batches.pop(arm, None)
        q.put(("phase", rank, "measure", time.perf_counter() - t2))
        tmp.cleanup()
    except BaseException as e:   # a broken barrier (another job died or hung) or anything else: the others go on
        try: barrier.abort()
        except Exception: pass
        q.put(("fatal", rank, one_line(e) + (" (another job failed, or waited past --barrier-timeout)" if type(e).__name__ == "BrokenBarrierError" else "")))
    finally:
        q.put(("done", rank))


def run_jobs(n: int, args, device: str) -> tuple[list, list, dict]:
    "Rows, error lines and the workers' metadata of one run of `n` jobs."
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(n, timeout=args.barrier_timeout)
    start = time.perf_counter()
    procs = [ctx.Process(target=worker, args=(r, args, device, barrier, q), daemon=True) for r in range(n)]
    for p in procs: p.start()
    results, errors, meta, phases, done, fatal = {}, [], {}, {}, set(), []
    last = time.perf_counter()
    while len(done) < n:
        try: msg = q.get(timeout=0.5)
        except queue.Empty: msg = None
        if msg is not None:
            last = time.perf_counter()
            kind, rank = msg[0], msg[1]
            if kind == "meta": meta[rank] = msg[2]
            elif kind == "phase":
                phases.setdefault(msg[2], []).append(msg[3])
                if len(phases[msg[2]]) == n: log(f"  jobs={n}: {msg[2]}: {max(phases[msg[2]]):.1f} s (slowest job), "
                                                f"{time.perf_counter() - start:.1f} s since start")
            elif kind == "row":
                results.setdefault((msg[2], msg[3]), {})[rank] = msg[4]
                r = results[msg[2], msg[3]]
                if len(r) == n:
                    log(f"  jobs={n}: {msg[2]:>14} {msg[3]}: {sum(v['images'] / v['seconds'] for v in r.values()):10.1f} images/s")
            elif kind == "error": errors.append((msg[2], msg[3], rank, msg[4]))
            elif kind == "fatal": fatal.append(f"job {rank}: {msg[2]}")
            elif kind == "done": done.add(rank)
            continue
        for r, p in enumerate(procs):   # a job that died without saying so: free the others from the barrier
            if r not in done and not p.is_alive():
                barrier.abort(); done.add(r); fatal.append(f"job {r}: exited with code {p.exitcode}")
        if barrier.broken and time.perf_counter() - last > args.barrier_timeout + 30:
            for r, p in enumerate(procs):
                if r not in done: p.terminate(); done.add(r); fatal.append(f"job {r}: hung, terminated")
    for p in procs: p.join(timeout=10)
    log(f"  jobs={n}: {time.perf_counter() - start:.1f} s in all")
    rows, lines = [], [f"jobs={n} {f}" for f in fatal]
    for arm in args.arms:
        for prec in args.precisions:
            errs = sorted({e for a, pr, _, e in errors if (a, pr) == (arm, prec)})
            if errs: lines.append(f"{arm} {prec} jobs={n}: {'; '.join(errs)}"); continue
            r = results.get((arm, prec), {})
            if len(r) < n:
                if not fatal: lines.append(f"{arm} {prec} jobs={n}: {n - len(r)} of {n} jobs gave no figure")
                continue
            rates = [v["images"] / v["seconds"] for v in r.values()]
            span = max(v["end"] for v in r.values()) - min(v["start"] for v in r.values())
            rows.append(dict(arm=arm, precision=prec, jobs=n, images_per_s_total=sum(rates), images_per_s_per_job=sum(rates) / n,
                             images_per_s_aggregate=sum(v["images"] for v in r.values()) / span,
                             cpu_s=sum(v["cpu_s"] for v in r.values()), cpu_s_per_job=[r[k]["cpu_s"] for k in sorted(r)],
                             seconds_per_job=[r[k]["seconds"] for k in sorted(r)], batch_size=r[0]["batch_size"],
                             steps=args.steps, warmup=args.warmup, threads=args.threads, device_type=device.split(":")[0],
                             device=(meta.get(0) or {}).get("device"), torch=(meta.get(0) or {}).get("torch")))
    return rows, lines, meta.get(0) or next(iter(meta.values()), {})


def fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(rows: list, args, against: dict | None) -> str:
    by = {(r["arm"], r["precision"], r["jobs"]): r["images_per_s_total"] for r in rows}
    one = 1 if 1 in args.jobs else min(args.jobs)
    more = [n for n in args.jobs if n != one]
    lo, hi = ("fp32", "bf16") if {"fp32", "bf16"} <= set(args.precisions) else (None, None)
    head = ["arm".rjust(14), "precision".rjust(9)] + [(f"{n} job" + ("s" if n > 1 else "") + " img/s").rjust(14) for n in args.jobs]
    if lo: head.append(f"bf16/fp32 @{one}".rjust(14))
    head += [f"{n}/{one} jobs".rjust(10) for n in more]
    if against is not None: head += [f"vs peer @{n}".rjust(11) for n in args.jobs]
    out = ["  ".join(head)]
    for arm in args.arms:
        for p in args.precisions:
            cells = [f"{arm:>14}", f"{p:>9}"]
            vals = [by.get((arm, p, n)) for n in args.jobs]
            cells += [("-" if v is None else f"{v:.1f}").rjust(14) for v in vals]
            if lo:
                a, b = by.get((arm, lo, one)), by.get((arm, hi, one))
                cells.append(f"{fmt(b / a) if p == hi and a and b else '':>14}")
            for n in more:
                a, b = by.get((arm, p, one)), by.get((arm, p, n))
                cells.append(f"{fmt(b / a if a and b else None):>10}")
            if against is not None:
                for n in args.jobs:
                    a, b = against.get((arm, p, n)), by.get((arm, p, n))
                    cells.append(f"{fmt(b / a if a and b else None):>11}")
            out.append("  ".join(cells))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda (or cuda:K), or auto: cuda where available")
    p.add_argument("--jobs", type=int, nargs="+", default=[1], help="numbers of jobs sharing the device, e.g. 1 8")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ALL_ARMS, metavar="ARM",
                   help=f"arms to measure: {', '.join(ALL_ARMS)} (default: {' '.join(ARMS)})")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    p.add_argument("--threads", type=int, default=1, help="torch threads in each job")
    p.add_argument("--barrier-timeout", type=float, default=300.0, help="seconds a job waits for the others before giving up")
    p.add_argument("--out", help="store the rows in this JSON file")
    p.add_argument("--against", help="a stored result (--out of another run) to compare with: this / that")
    p.add_argument("--table", metavar="FILE.json", help="measure nothing: print the table of this stored result (with --against, --arms)")
    args = p.parse_args()
    if min(args.jobs) < 1 or args.steps < 1 or args.warmup < 0: p.error("--jobs and --steps must be >= 1, --warmup >= 0")
    args.jobs = sorted(dict.fromkeys(args.jobs))
    args.arms, args.precisions = list(dict.fromkeys(args.arms)), list(dict.fromkeys(args.precisions))
    device = args.device
    if device == "auto" and not args.table:
        import torch   # the main process only asks; the jobs do the work
        device = "cuda" if torch.cuda.is_available() else "cpu"
    against = None
    if args.against:
        stored = json.loads(open(args.against).read())
        against = {(r["arm"], r["precision"], r["jobs"]): r["images_per_s_total"] for r in stored["rows"]}
    start = time.perf_counter()
    rows, failed, meta = [], [], {}
    if args.table:
        doc = json.loads(open(args.table).read())
        rows, failed, meta = [r for r in doc["rows"] if r["arm"] in args.arms], doc.get("failed", []), doc.get("meta", {})
        args.jobs = sorted({r["jobs"] for r in rows}) or meta.get("jobs", args.jobs)
        args.precisions = [q for q in args.precisions if any(r["precision"] == q for r in rows)]
        for k in ("steps", "warmup", "threads"): setattr(args, k, meta.get(k, getattr(args, k)))
        device, args.out = meta.get("device_type", device), None
        print(f"stored result {args.table} ({meta.get('date', '?')}): {meta.get('command', '')}")
    for n in ([] if args.table else args.jobs):
        log(f"jobs={n}: starting {n} process{'es' if n > 1 else ''} on {device}")
        try: r, lines, m = run_jobs(n, args, device)
        except Exception as e: r, lines, m = [], [f"jobs={n}: {one_line(e)}"], {}
        rows += r; failed += lines; meta = meta or m
        for line in lines: log(f"FAILED {line}")
    wall = meta.get("wall_s", 0.0) if args.table else time.perf_counter() - start
    if not args.table: log(f"all: {wall:.1f} s")
    print(f"training throughput, images/s (sum over jobs): {meta.get('device', device)} ({device}), torch {meta.get('torch', '?')}, "
          f"{args.threads} thread{'s' if args.threads > 1 else ''} per job, {args.steps} timed steps after {args.warmup}"
          + ("" if device.startswith("cuda") or meta.get("bf16_units", True) else "; this CPU has no bf16 units: bf16 is emulated"))
    if against is not None:
        print(f"vs peer: this run / {args.against} ({stored.get('meta', {}).get('device', '?')}), same arm, precision and jobs")
    print(table(rows, args, against))
    for line in failed: print(f"failed: {line}")
    print(f"wall time {wall:.1f} s")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        doc = dict(meta=dict(meta, device_type=device.split(":")[0], cpu=cpu_model(), jobs=args.jobs, steps=args.steps,
                             warmup=args.warmup, threads=args.threads, baseline=f"baseline of the {BASELINE_FROM} study",
                             command=" ".join(sys.argv), wall_s=wall, date=time.strftime("%Y-%m-%d %H:%M:%S")),
                   rows=rows, failed=failed)
        with open(args.out, "w") as f: json.dump(doc, f, indent=1)
        log(f"stored {args.out}")


if __name__ == "__main__":
    main()
