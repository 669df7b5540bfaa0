"""Reference values from the authors' DCML code, for `tests/test_parity_dcml.py`.

Usage (not part of the test command: it needs a copy of the official repository):

    git --git-dir=<mirror> archive HEAD | tar -x -C /tmp/dcml_official
    python tools/parity_dcml.py /tmp/dcml_official --commit <sha>

The script runs the official `architectures/multifeature_resnet50.py` (wzzheng/DCML) -- `Network.__init__`,
`Network.forward` and `soft_select` -- and `criteria/margin.py`'s `Criterion` on fixed, seeded float64 inputs. Nothing of
the official code is copied. Three things make it run on a CPU without its dependencies:
- `pretrainedmodels` is not installed: a stand-in module whose `resnet50` is a backbone of identity layers, so that the
  official forward's input *is* the backbone's feature vector (the learners, compositors and losses are the official ones);
- the architecture file does not compile (`else if` at lines 92 and 102, a SyntaxError in Python): the script reads it,
  replaces those two `else if` by `elif` in memory, and compiles it under its own file name (line numbers unchanged);
- `batchminer/distance.py`'s negative distribution is computed on the same normalised concatenation;
- the margin loss's `batchminer` is the official constructor argument; a fixed list of triplets is passed, so both codes
  see the same triplets (the official distance-weighted miner draws them with numpy's global generator).
It also records that the README's default (`--diva_features discriminative`, one feature) fails in the official forward.

Writes `tests/fixtures/parity/dcml.npz` (numbers only) and `dcml.json` (repository, commit, file:line per function and
that line's text)."""
from __future__ import annotations
import argparse, importlib.util, inspect, json, subprocess, sys, types
from pathlib import Path
from parity_common import cited_lines, fail, commit_of   # tools/parity_common.py (this folder is on sys.path)
from unittest import mock
import numpy as np
import torch
import torch.nn as nn

REPO = "wzzheng/DCML"
ARCH, MARGIN, DISTANCE = "architectures/multifeature_resnet50.py", "criteria/margin.py", "batchminer/distance.py"


def identity_resnet(feature_dim: int):
    "Stand-in for pretrainedmodels' resnet50: every layer the identity, `last_linear.in_features` the feature size."
    def resnet50(num_classes=1000, pretrained=None):
        m = nn.Module()
        for name in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool"): setattr(m, name, nn.Identity())
        m.last_linear = nn.Linear(feature_dim, num_classes)
        return m
    return resnet50


def load_arch(repo: Path, feature_dim: int):
    "The official architecture module, compiled with its two `else if` read as `elif`; the number of lines changed."
    ptm = types.ModuleType("pretrainedmodels"); ptm.resnet50 = identity_resnet(feature_dim)
    sys.modules.setdefault("pretrainedmodels", ptm)
    text = (repo / ARCH).read_text()
    try: compile(text, str(repo / ARCH), "exec"); fixed = 0
    except SyntaxError: fixed = text.count("else if")
    mod = types.ModuleType("multifeature_resnet50"); mod.__file__ = str(repo / ARCH)
    exec(compile(text.replace("else if", "elif"), str(repo / ARCH), "exec"), mod.__dict__)
    return mod, fixed


def load_margin(repo: Path):
    spec = importlib.util.spec_from_file_location("official_margin", repo / MARGIN)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def line_of(repo: Path, path: str, needle: str) -> str:
    "file:line of the first line of `path` that contains `needle`."
    for i, line in enumerate((repo / path).read_text().splitlines(), 1):
        if needle in line: return f"{path}:{i}"
    raise ValueError(f"{needle!r} not in {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo", type=Path, help="a local copy of wzzheng/DCML")
    ap.add_argument("--commit", help="its commit (read with git where the copy is a checkout)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/parity")
    args = ap.parse_args()
    if not (args.repo / ARCH).is_file(): fail(f"{args.repo} holds no {ARCH}: pass a copy of {REPO}")
    commit = commit_of(args.repo, args.commit)
    torch.set_default_dtype(torch.float64)

    B, Fdim, K, D, M, n_classes = 12, 10, 4, 8, 4, 6          # the official forward runs only with compos_num = 4
    arch, fixed = load_arch(args.repo, Fdim)
    margin = load_margin(args.repo)
    features = ["discriminative", "selfsimilarity", "shared", "intra"]
    opt = types.SimpleNamespace(arch="resnet50_frozen_normalize", ensemble_num=K, compos_num=M, embed_dim=D, diva_features=features)
    torch.manual_seed(0)
    net = arch.Network(opt)
    with torch.no_grad():   # learners: PyTorch's default init; compositors: normal, std 0.3, so that the softmax is not saturated
        for layer in net.compos_layer: layer.weight.normal_(0, 0.3); layer.bias.normal_(0, 0.3)
    x = torch.randn(B, Fdim)
    labels = torch.arange(n_classes).repeat_interleave(B // n_classes)

    # ---- one forward, recording the sub-embeddings g_k (their gradient too) and the compositors' softmax outputs
    subs, weights = [], []
    def keep(module, inputs, output): output.retain_grad(); subs.append(output)   # returns None: the output is unchanged
    hooks = [layer.register_forward_hook(keep) for layer in net.ensemble_layer]
    softmax = torch.nn.functional.softmax
    def recording_softmax(*a, **k): out = softmax(*a, **k); weights.append(out); return out
    torch.nn.functional.softmax = recording_softmax
    try: out, feats, rein = net(x)
    finally: torch.nn.functional.softmax = softmax
    for h in hooks: h.remove()
    g = torch.stack(subs, 1)                                   # (B, K, D)
    c = torch.stack(weights, 1)                                # (B, M, K)
    composites = torch.stack([out[f] for f in features], 1)    # (B, M, D), normalised (arch '..._normalize')
    raw = torch.stack([arch.soft_select(torch.cat(subs, 1).detach(), weights[m].detach(), K, D) for m in range(M)], 1)

    # ---- J_rein (the official `supervise_loss`) and its gradient on the compositors
    net.zero_grad(); rein.backward(retain_graph=True)
    rein_grad_w = torch.stack([l.weight.grad.clone() for l in net.compos_layer]); rein_grad_b = torch.stack([l.bias.grad.clone() for l in net.compos_layer])

    # ---- the margin loss on fixed triplets: on every composite (J_T), and on the normalised concatenation (J_dis)
    g_rng = np.random.default_rng(0)
    trip = []
    for a in range(B):
        same = np.flatnonzero(labels.numpy() == labels[a].item()); other = np.flatnonzero(labels.numpy() != labels[a].item())
        trip.append([a, int(g_rng.choice(same[same != a])), int(g_rng.choice(other))])
    mopt = types.SimpleNamespace(n_classes=n_classes, loss_margin_margin=0.2, loss_margin_nu=0, loss_margin_beta_constant=False,
                                 loss_margin_beta=1.2, loss_margin_beta_lr=5e-4)
    crit = margin.Criterion(mopt, lambda batch, labels: trip)
    j_sub, j_sub_grad_g, j_sub_grad_w = [], [], []
    for m, f in enumerate(features):
        net.zero_grad(); [s.grad.zero_() for s in subs if s.grad is not None]
        loss = crit(out[f], labels); loss.backward(retain_graph=True)
        j_sub.append(loss.item()); j_sub_grad_g.append(torch.stack([s.grad.clone() for s in subs], 1))
        j_sub_grad_w.append(net.compos_layer[m].weight.grad.clone())
    y = torch.nn.functional.normalize(torch.cat([s.detach() for s in subs], 1), dim=-1).requires_grad_()
    j_dis = crit(y, labels); j_dis.backward()

    # ---- the official distance-weighted batch miner's negative distribution (`--batch_mining distance`) on the same y
    spec = importlib.util.spec_from_file_location("official_distance", args.repo / DISTANCE)
    dist_mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(dist_mod)
    miner = dist_mod.BatchMiner(types.SimpleNamespace(miner_distance_lower_cutoff=0.5, miner_distance_upper_cutoff=1.4))
    yd = y.detach(); dd = miner.pdist(yd).clamp(min=miner.lower_cutoff)
    miner_probs = np.stack([miner.inverse_sphere_distances(yd, dd[i], labels.numpy(), labels[i].item()) for i in range(B)])

    # ---- the README's default, one feature: the official forward fails
    opt1 = types.SimpleNamespace(**{**vars(opt), "diva_features": ["discriminative"]})
    net.pars = opt1
    try: net(x); single = "ran"
    except Exception as e: single = f"{type(e).__name__}: {e}"
    net.pars = opt

    w = torch.stack([l.weight.detach() for l in net.compos_layer]); b = torch.stack([l.bias.detach() for l in net.compos_layer])
    arrays = dict(features=x, labels=labels, sub_embeddings=g.detach(), compositor_weight=w, compositor_bias=b,
                  weights=c.detach(), composites_raw=raw.detach(), composites=composites.detach(), rein=rein.detach(),
                  rein_grad_weight=rein_grad_w, rein_grad_bias=rein_grad_b, triplets=torch.tensor(trip),
                  j_sub=torch.tensor(j_sub), j_sub_grad_sub=torch.stack(j_sub_grad_g), j_sub_grad_weight=torch.stack(j_sub_grad_w),
                  j_dis=j_dis.detach(), j_dis_grad=y.grad)
    arrays = {k: v.numpy() for k, v in arrays.items()} | {"miner_probs": miner_probs, "miner_distances": miner.pdist(yd).numpy()}
    out_dir = args.out; out_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_dir / "dcml.npz", **arrays)
    meta = {"repository": f"https://github.com/{REPO}", "commit": commit, "script": "tools/parity_dcml.py",
            "stubbed_imports": ["pretrainedmodels (resnet50: identity layers)"],
            "syntax_fixed": f"{fixed} x 'else if' read as 'elif' in {ARCH} (the file does not compile as published)",
            "single_feature_forward": single,
            "functions": {
                "sub_embeddings": line_of(args.repo, ARCH, "x_embedding = torch.cat"),
                "weights": line_of(args.repo, ARCH, "prob.append(torch.nn.functional.softmax"),
                "composites_raw": line_of(args.repo, ARCH, "def soft_select"),
                "composites": line_of(args.repo, ARCH, "out_dict['discriminative'] = torch.nn.functional.normalize(mod_x1"),
                "rein": line_of(args.repo, ARCH, "supervise_loss = supervise_loss +"),
                "j_sub": line_of(args.repo, MARGIN, "def forward"), "j_dis": line_of(args.repo, MARGIN, "def forward"),
                "loss_sum": line_of(args.repo, "main.py", "loss = supervise_loss"),
                "miner_probs": line_of(args.repo, DISTANCE, "def inverse_sphere_distances")},
            "settings": dict(batch=B, feature_dim=Fdim, n_learners=K, learner_dim=D, n_compositors=M, n_classes=n_classes,
                             margin=0.2, beta=1.2, diva_features=features, arch=opt.arch, init="learners: torch default; compositors: normal(0, 0.3)"),
            "arrays": {k: list(v.shape) for k, v in arrays.items()}}
    meta["lines"] = cited_lines(args.repo, meta["functions"])
    (out_dir / "dcml.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out_dir / 'dcml.npz'} ({(out_dir / 'dcml.npz').stat().st_size} bytes) and dcml.json; commit {commit}; one feature: {single}")


if __name__ == "__main__": main()
