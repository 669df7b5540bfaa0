"""Would the parity tests notice a small change? Mutate one compared function of dml_book at a time and run its tests.

    python tools/parity_mutations.py [--scale 2e-10] [--only hdml]

Each mutation wraps one function of the package, in memory and in a fresh process, so that its output (every tensor
or number it returns) is multiplied by 1 + scale (`x`), gets `scale` added (`+`), or has its largest element alone
multiplied (`one`, for an unnormalised distribution, which a common factor leaves unchanged): a change just above the
1e-10 relative that the parity tests must catch. Three rows run the N-pair test of `HDML.objectives` alone: the labels
of the synthetic N x N grid (`labels`), the penalty's factor (`l2`, 1e-7, which moves J(T~) by 2e-10), and J(T~).
The wrapper replaces the function in every loaded dml_book module that holds it (and on its class for a method),
before the tests import it; nothing on disk changes. Then the method's parity tests run (pytest, in that process); a
mutation is caught when they fail. The script prints one table row per mutation and exits 1 if any mutation passed
unnoticed (or if an unmutated run fails).
"""
import argparse, importlib, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (method, target "module:attribute" or "module:Class.method", how, the parity test file)
MUTATIONS = [
    ("ala", "dml_book.methods.ala:one_step", "x", "tests/test_parity_ala.py"),
    ("ala", "dml_book.methods.ala:meta_objective", "x", "tests/test_parity_ala.py"),
    ("ala", "dml_book.methods.ala:meta_surrogate", "x", "tests/test_parity_ala.py"),
    ("hdml", "dml_book.methods.hdml:pulling_lambda", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:hardness_aware_augment", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:grouped_npair_loss", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:generator_objective", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:official_j_m", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:synthesis_weight", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:decay_penalty", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:reconstruction_loss", "x", "tests/test_parity_hdml.py"),
    ("hdml", "dml_book.methods.hdml:WindowAverage.update", "x", "tests/test_parity_hdml.py"),
    # the N-pair path alone, through HDML.objectives (test_npair_objectives_*): the grid's labels, its penalty
    ("hdml", "dml_book.methods.hdml:npair_synthesis", "labels", "tests/test_parity_hdml.py::test_npair_objectives_equal_the_official_ones"),
    ("hdml", "dml_book.methods.hdml:grouped_npair_loss", "l2", "tests/test_parity_hdml.py::test_npair_objectives_equal_the_official_ones", 1e-7),
    ("hdml", "dml_book.methods.hdml:grouped_npair_loss", "x", "tests/test_parity_hdml.py::test_npair_objectives_equal_the_official_ones"),
    ("dcml", "dml_book.methods.dcml:rein_loss", "x", "tests/test_parity_dcml.py"),
    ("dcml", "dml_book.methods.dcml:compose", "x", "tests/test_parity_dcml.py"),
    ("dcml", "dml_book.methods.dcml:Compositor.forward", "x", "tests/test_parity_dcml.py"),
    ("dcml", "dml_book.losses.triplet:MarginLoss.compute", "x", "tests/test_parity_dcml.py"),
    ("dcml", "dml_book.miners:DistanceWeightedMiner.probabilities", "x", "tests/test_parity_dcml.py"),
    ("pads", "dml_book.methods.pads_policy:apply_actions", "x", "tests/test_parity_pads.py"),
    ("pads", "dml_book.methods.pads_policy:TrainingState.forward", "x", "tests/test_parity_pads.py"),
    ("pads", "dml_book.methods.pads_policy:PolicyLearner.update", "x", "tests/test_parity_pads.py"),
    ("pads", "dml_book.methods.pads:negative_weights", "one", "tests/test_parity_pads.py"),   # unnormalised: a common factor is no change
    ("pads", "dml_book.methods.pads:class_distances", "x", "tests/test_parity_pads.py"),
    ("pads", "dml_book.methods.pads:init_probs", "x", "tests/test_parity_pads.py"),
    ("dmml", "dml_book.methods.dmml:meta_cell_distances", "x", "tests/test_parity_dmml.py"),
    ("dmml", "dml_book.methods.dmml:meta_cell_distances", "+", "tests/test_parity_dmml.py"),
    ("dmml", "dml_book.methods.dmml:episode_loss", "x", "tests/test_parity_dmml.py"),
]


def perturb(out, how: str, scale: float):
    "The output moved: every floating tensor or float in it times 1 + scale (`x`) or plus scale (`+`)."
    import torch
    if how == "one":                    # the largest element of the output alone
        big = torch.zeros_like(out); big.view(-1)[out.abs().argmax()] = scale
        return out * (1 + big)
    f = (lambda v: v * (1 + scale)) if how == "x" else (lambda v: v + scale)
    if torch.is_tensor(out): return f(out) if out.is_floating_point() else out
    if isinstance(out, float): return f(out)
    if isinstance(out, dict): return {k: perturb(v, how, scale) for k, v in out.items()}
    if isinstance(out, tuple) and hasattr(out, "_fields"): return type(out)(*(perturb(v, how, scale) for v in out))
    if isinstance(out, (tuple, list)): return type(out)(perturb(v, how, scale) for v in out)
    if hasattr(out, "__dataclass_fields__"):
        import dataclasses
        return dataclasses.replace(out, **{k: perturb(getattr(out, k), how, scale) for k in out.__dataclass_fields__})
    return out


def mutate(target: str, how: str, scale: float):
    "Replace the function `target` by one whose output is perturbed, wherever dml_book holds it."
    import functools
    mod_name, attr = target.split(":")
    mod = importlib.import_module(mod_name)
    importlib.import_module("dml_book.methods")        # load the method modules, which import each other's names
    owner, name = (getattr(mod, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (mod, attr)
    orig = getattr(owner, name)
    @functools.wraps(orig)
    def mutated(*a, **k):
        if how == "l2":                 # grouped_npair_loss(emb, a, p, n, l2_reg): the penalty's factor
            return orig(*a[:4], (a[4] if len(a) > 4 else k.pop("l2_reg", 0.)) * (1 + scale), **k)
        out = orig(*a, **k)
        if how == "labels":             # npair_synthesis: cell (i, j) labelled with p[i]'s class, not p[j]'s
            import torch
            z_in, l_in, syn = out; n = len(a[2][0])
            return z_in, torch.cat([l_in[:n], l_in[n:].view(n, n).T.reshape(-1)]), syn
        return perturb(out, how, scale)
    if owner is not mod: setattr(owner, name, mutated); return
    for m in list(sys.modules.values()):
        if getattr(m, "__name__", "").startswith("dml_book") and getattr(m, name, None) is orig: setattr(m, name, mutated)


def child(target: str, how: str, scale: float, test: str) -> int:
    "In this (fresh) process: mutate, then run the test file; pytest's exit status."
    import pytest
    if target != "none": mutate(target, how, scale)
    return pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-x", "--no-header", "-rf", str(ROOT) + "/" + test])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=2e-10, help="relative change of each mutated output (default 2e-10)")
    ap.add_argument("--only", help="one method: ala, hdml, dcml, pads or dmml")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child: sys.exit(child(args.child[0], args.child[1], float(args.child[2]), args.child[3]))
    rows = [m for m in MUTATIONS if args.only in (None, m[0])]
    if not rows: sys.exit(f"error: --only must be one of ala, hdml, dcml, pads, dmml, got {args.only!r}")
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}
    run = lambda t, how, test, scale=args.scale: subprocess.run([sys.executable, __file__, "--child", t, how, str(scale), test],
                                              capture_output=True, text=True, env=env, cwd=ROOT)
    bad = 0
    rows = [(*m[:4], m[4] if len(m) > 4 else args.scale) for m in rows]
    for test in dict.fromkeys(m[3] for m in rows):                     # each file passes unmutated
        r = run("none", "x", test)
        if r.returncode: print(f"error: {test} fails without a mutation:\n{r.stdout[-2000:]}", file=sys.stderr); sys.exit(2)
    print(f"| method | mutated function | perturbation | caught | first failing test |\n|---|---|---|---|---|")
    for method, target, how, test, scale in rows:
        r = run(target, how, test, scale)
        failed = [l.split(" ")[1] for l in r.stdout.splitlines() if l.startswith("FAILED ")]
        caught = r.returncode == 1 and failed
        bad += not caught
        what = {"x": f"output x (1 + {scale:g})", "+": f"output + {scale:g}", "one": f"largest element x (1 + {scale:g})",
                "l2": f"l2_reg x (1 + {scale:g})", "labels": "grid labels p[i] for p[j]"}[how]
        first = failed[0].split("::")[-1] if failed else f"none (pytest exit {r.returncode})"
        print(f"| {method} | `{target.split(':')[1]}` | {what} | {'yes' if caught else 'NO'} | `{first}` |", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
