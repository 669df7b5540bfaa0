"""Reference values from the authors' DMML code, for `tests/test_parity_dmml.py`.

    python tools/parity_dmml.py PATH [--commit SHA] [--out tests/fixtures/parity/dmml.json]

PATH is a local copy of https://github.com/CHENGY12/DMML (a clone, or `git archive` of one: then name its commit with
--commit). The script imports the official `loss/dmml.py` from PATH at run time (nothing of it is copied here), runs its
`DMMLLoss` in float64 on one fixed, seeded episode (raw embeddings: center and hard mining modes, the latter with margins
0.4 and 0; L2-normalised ones: hard mining) and writes what it computes: the set distances from every query to
every meta-cell (the negated input of its log-softmax, caught on the way in), the loss, and the loss's gradient with
respect to the embeddings, with the file:line and text of each official function used. It needs PyTorch only; the test that reads the fixture needs neither this script nor the
official code.
"""
import argparse, importlib, inspect, json, subprocess, sys
from pathlib import Path
from parity_common import cited_lines, commit_of, fixture_parser   # tools/parity_common.py (this folder is on sys.path)

import torch
import torch.nn.functional as F

REPO = "CHENGY12/DMML"
N_SUPPORT, N_QUERY, DIM = 3, 2, 6
LABELS = [5] * 5 + [1] * 5 + [8] * 5 + [2] * 5          # four classes, 3 support + 2 query images each, class by class


def where(obj, root: Path) -> str:
    "file:line of an official function or class."
    return f"{Path(inspect.getsourcefile(obj)).resolve().relative_to(root.resolve())}:{inspect.getsourcelines(obj)[1]}"


class Catch:
    "Stands in for `torch.nn.functional` inside the official module: records what its log_softmax is given."
    def __init__(self): self.seen = []
    def __getattr__(self, name): return getattr(F, name)
    def log_softmax(self, x, *args, **kw):
        self.seen.append(x.detach().clone()); return F.log_softmax(x, *args, **kw)


def run(mod, catch, feature_of, u, mode, margin):
    "Official loss on feature_of(u), its set distances, and d loss / d u."
    u = u.clone().requires_grad_()
    catch.seen.clear()
    loss = mod.DMMLLoss(num_support=N_SUPPORT, distance_mode=mode, margin=margin)(feature_of(u), torch.tensor(LABELS))
    loss.backward()
    (neg_d,) = catch.seen
    return dict(distances=(-neg_d).tolist(), loss=loss.item(), grad=u.grad.tolist())


def main(argv=None):
    ap = fixture_parser(__doc__, "dmml.json")
    args = ap.parse_args(argv)
    if not (args.path/"loss"/"dmml.py").is_file(): sys.exit(f"{args.path} has no loss/dmml.py: not a copy of {REPO}")
    sys.path.insert(0, str(args.path.resolve()))
    mod, common = importlib.import_module("loss.dmml"), importlib.import_module("loss.common")
    catch = Catch(); mod.F = catch                       # only log_softmax is watched; every other call goes to torch
    g = torch.Generator().manual_seed(49)
    raw = torch.randn(len(LABELS), DIM, generator=g, dtype=torch.float64)
    on_sphere = torch.randn(len(LABELS), DIM, generator=g, dtype=torch.float64)
    ident, unit = (lambda u: u), (lambda u: F.normalize(u, dim=1))
    cases = {"center": run(mod, catch, ident, raw, "center_support", 0.4),
             "hard": run(mod, catch, ident, raw, "hard_mining", 0.4),
             "hard_margin0": run(mod, catch, ident, raw, "hard_mining", 0.0),
             "hard_unit": run(mod, catch, unit, on_sphere, "hard_mining", 0.4)}
    fixture = dict(
        repository=f"https://github.com/{REPO}", commit=commit_of(args.path, args.commit),
        functions={"DMMLLoss.forward": where(mod.DMMLLoss.forward, args.path), "euclidean_dist": where(common.euclidean_dist, args.path),
                   "cosine_dist": where(common.cosine_dist, args.path)},
        inputs=dict(labels=LABELS, n_support=N_SUPPORT, n_query=N_QUERY, raw=raw.tolist(), on_sphere=on_sphere.tolist()),
        note="distances: rows = queries of the classes in ascending label order, columns = classes in ascending order; "
             "center and hard use `raw` as the embeddings, hard_unit uses `on_sphere` L2-normalised (gradient w.r.t. on_sphere)",
        cases=cases)
    fixture["lines"] = cited_lines(args.path, fixture["functions"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes) from {REPO}@{fixture['commit'][:12]}")


if __name__ == "__main__":
    main()
