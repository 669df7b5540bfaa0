"""Reference values from the authors' PADS code, for `tests/test_parity_pads.py`.

Usage (not part of the test command: it needs a copy of the official repository):

    git --git-dir=<mirror>/.git archive HEAD | tar -x -C /tmp/pads_official
    PYTHONPATH=<dir with scipy and scikit-learn, optional> python tools/parity_pads.py /tmp/pads_official --commit <sha>

The script imports the official `PADS_utilities.py` (Confusezius/CVPR2020_PADS) and runs its own classes on fixed, seeded
float64 inputs: `PADS.update` (state, policy loss and gradient, Adam step, PPO's old policy, the actions and the
distribution update) driven by scripted validation metrics, `Parametric_Sampler.give` (the negatives of one batch) and
`Compute_Complete_Metrics.dists` (two entries of the state). Nothing of the official code is copied: where it imports a
package that is not installed (faiss, pandas, PIL, torchvision, pretrainedmodels, ...; scipy and scikit-learn when absent)
an empty stand-in module is registered, and CUDA calls are pointed at the CPU in float64 (`Module.cuda` returns the
module, `torch.cuda.FloatTensor` is `torch.DoubleTensor`). The numpy draws of the official code are recorded, not
replaced: before each `np.random.choice(..., p=...)` the generator's state is saved, the uniform that the call consumes
is read back, and the script checks that the official choice is the inverse CDF of `p` at that uniform.

It also runs `give` twice more, under a p with empty edge bins (no official mass on candidates we drop) and on a chosen
distance matrix (the sampler's `pdist` returns it: distances on both grids, ties, 0, both ends), and drives
`update_sample_distr` for 300 calls until its clip of the unnormalised p binds.

Writes `tests/fixtures/parity/pads.npz` (numbers only) and `pads.json` (the repository, commit, file:line and that
line's text of every function run, and the settings)."""
from __future__ import annotations
import argparse, importlib.util, inspect, json, os, subprocess, sys, types
from pathlib import Path
from parity_common import cited_lines, fail, commit_of   # tools/parity_common.py (this folder is on sys.path)
from unittest import mock
import numpy as np
import torch

REPO = "Confusezius/CVPR2020_PADS"
MISSING = ["faiss", "pandas", "tqdm", "matplotlib", "matplotlib.pyplot", "PIL", "PIL.Image", "torchvision",
           "torchvision.transforms", "torchvision.models", "pretrainedmodels", "pretrainedmodels.utils", "wandb",
           "scipy", "scipy.spatial", "scipy.spatial.distance", "scipy.stats", "sklearn", "sklearn.preprocessing",
           "sklearn.metrics", "sklearn.cluster", "sklearn.decomposition"]


def stub_missing() -> list[str]:
    "Register an empty stand-in for every import of the official code that is not installed; the names stubbed."
    stubbed = []
    for name in MISSING:
        parent = name.rpartition(".")[0]
        if name in sys.modules: continue
        if (not parent or parent not in stubbed) and importlib.util.find_spec(name) is not None: continue
        sys.modules[name] = mock.MagicMock(name=name); stubbed.append(name)
        if parent: setattr(sys.modules[parent], name.rpartition(".")[2], sys.modules[name])
    return stubbed


def where(obj) -> str:
    "file:line of an official function or class."
    return f"{Path(inspect.getsourcefile(obj)).name}:{inspect.getsourcelines(obj)[1]}"


class Recorder:
    "Records (p, u, choice) of every `np.random.choice(n, p=p)` without changing the numpy stream."
    def __init__(self): self.draws, self.orig = [], np.random.choice
    def __call__(self, a, size=None, replace=True, p=None):
        state = np.random.get_state()
        out = self.orig(a, size, replace, p)
        if p is not None and size is None:
            after = np.random.get_state()
            np.random.set_state(state); u = np.random.random_sample()
            assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state()[1:3], after[1:3])), "one uniform per choice"
            cdf = np.cumsum(p); cdf /= cdf[-1]
            idx = int(np.searchsorted(cdf, u, side="right"))
            assert (np.arange(a) if isinstance(a, int) else np.asarray(a))[idx] == out, "choice is the inverse CDF at u"
            self.draws.append((np.asarray(p, dtype=float), u, idx))
        return out


def flat(params) -> np.ndarray: return np.concatenate([p.detach().reshape(-1).numpy() for p in params])
def flat_grad(params) -> np.ndarray: return np.concatenate([p.grad.detach().reshape(-1).numpy() for p in params])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo", type=Path, help="a local copy of Confusezius/CVPR2020_PADS")
    ap.add_argument("--commit", help="its commit (read with git where the copy is a checkout)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/parity")
    ap.add_argument("--calls", type=int, default=8, help="policy steps to drive")
    args = ap.parse_args()
    if not (args.repo / "PADS_utilities.py").is_file(): fail(f"{args.repo} holds no PADS_utilities.py: pass a copy of {REPO}")
    commit = commit_of(args.repo, args.commit)

    stubbed = stub_missing()
    torch.set_default_dtype(torch.float64)
    torch.nn.Module.cuda = lambda self, *a, **k: self            # the official code moves its policy to the GPU
    torch.cuda.FloatTensor = torch.DoubleTensor                   # and casts states and targets to cuda floats
    cwd = os.getcwd(); sys.path.insert(0, str(args.repo.resolve()))
    import PADS_utilities as off                                  # noqa: E402  (it chdirs into its folder)
    os.chdir(cwd)
    rec = Recorder(); np.random.choice = rec

    # ---- the PADS agent, as main.py builds it (SAMPLE_RUNS.sh settings; a small policy to keep the fixture small)
    torch.manual_seed(0); np.random.seed(0)
    K, hidden, action_values, history, windows, max_iter = 29, [6, 6], [0.8, 1, 1.25], 20, [2, 8, 16, 32], 1000
    logger = mock.MagicMock()
    general = dict(policy_lr=0.01, logger=logger, logname="RL-Policy", old_policy_update=5, metric_history=history,
                   mode="ppo", parameter_history=1, ppo_ratio=0.2, call_delay=0, sample_frequency=1, sup_metric_collect=-1,
                   wandb_log=False, ema_alpha=0.05, reward_update_w=0.99, log_distr_plots=False)
    state_pars = dict(n_support=K + 1, max_iter=max_iter, num_v_classes=10, state_metrics=["recall", "nmi", "dists"],
                      running_averages=windows, no_avg=False, include_train_metrics=False, k_vals=[1, 2, 4, 8],
                      metric_history=history, parameter_history=1)
    policy_pars = dict(output_dim=K, policy_size=hidden, action_values=action_values, use_a2c=True, w_init="none")
    save = Path("/tmp/pads_parity_run"); save.mkdir(exist_ok=True)
    sampler_pars = dict(n_support=K + 1, support_limit=[0.1, 1.4], include_same=True, init_distr="uniform_low",
                        include_pos=True, save_path=str(save), wandb_log=False, merge_oobs=False)
    val_pars = dict(logger=logger, logname="Val", reward_type=2, k_vals=[1, 2, 4, 8], state_metrics=["recall", "nmi", "dists"],
                    wandb_log=False, dataloader=types.SimpleNamespace(dataset=types.SimpleNamespace(avail_classes=list(range(10)))))
    pads = off.PADS(general, state_pars, policy_pars, sampler_pars, val_pars)
    criterion = types.SimpleNamespace(); pads.assign_sampler(criterion)
    init_distr = criterion.sampler.distr.copy()
    init_params = flat(pads.policy.parameters())

    # ---- scripted validation metrics: recall@1,2,4,8, NMI, intra, inter (the state's order), reward = mean(R@1, NMI)
    rng = np.random.default_rng(1)
    metrics = np.cumsum(rng.normal(0.004, 0.01, (args.calls, 7)), 0) + np.array([0.45, 0.55, 0.65, 0.75, 0.5, 0.4, 0.9])
    call = {"i": 0}
    def compute(model):
        m = metrics[call["i"]]; call["i"] += 1
        return float(np.mean([m[0], m[4]])), list(m)
    pads.calc_val_metrics = types.SimpleNamespace(compute=compute)

    captured, orig_backward = [], torch.Tensor.backward
    def backward(self, *a, **k): captured.append(self.detach().item()); return orig_backward(self, *a, **k)
    torch.Tensor.backward = backward
    states, probs, actions, uniforms, losses, grads, params_after, old_params, distrs, nonorm = [], [], [], [], [], [], [], [], [], []
    pads.update(criterion, None, 0, 0)                            # the first call only counts (sample_frequency = 1)
    for t in range(args.calls):
        n_draws, n_losses = len(rec.draws), len(captured)
        it = 10 * (t + 1)
        orig_make, orig_act = pads.state_maker.make_state, pads.policy.act
        def make_state(*a, **k):
            s = orig_make(*a, **k); states.append(s.reshape(-1).copy()); return s
        def act(x):   # the probabilities `Policy.act` draws from (after this step's update), (K, 3)
            with torch.no_grad(): probs.append(torch.softmax(pads.policy(x)[1], 1)[0].numpy().T.copy())
            return orig_act(x)
        pads.state_maker.make_state, pads.policy.act = make_state, act
        pads.update(criterion, None, it, 0)
        pads.state_maker.make_state = orig_make; del pads.policy.act
        draws = rec.draws[n_draws:]
        assert len(draws) == K
        actions.append([d[2] for d in draws]); uniforms.append([d[1] for d in draws])
        if len(captured) > n_losses:
            losses.append(captured[-1]); grads.append(flat_grad(pads.policy.parameters()))
            params_after.append(flat(pads.policy.parameters()))
        old_params.append(flat(pads.old_policy.parameters()))
        distrs.append(criterion.sampler.distr.copy()); nonorm.append(criterion.sampler.no_norm_distr.copy())
    torch.Tensor.backward = orig_backward

    # ---- the negatives of one batch: Parametric_Sampler.give with a seeded p that has mass on every bin (the policy's
    #      p after a few steps is ~1e-15 outside its emphasis, which would hide the departures at the interval's ends)
    g = np.random.default_rng(2)
    criterion.sampler.no_norm_distr = g.dirichlet(np.ones(K)); criterion.sampler.distr = criterion.sampler.norm(criterion.sampler.no_norm_distr)
    batch = g.normal(size=(32, 4)); batch /= np.linalg.norm(batch, axis=1, keepdims=True)
    labels = np.repeat(np.arange(8), 4)
    n_draws = len(rec.draws); np.random.seed(3)
    triplets = np.array(criterion.sampler.give(torch.from_numpy(batch), labels))
    neg_draws = rec.draws[n_draws:]
    neg_p = np.stack([d[0] for d in neg_draws]); neg_u = np.array([d[1] for d in neg_draws])
    dist_matrix = criterion.sampler.pdist(torch.from_numpy(batch)).numpy()
    sampler_distr = criterion.sampler.distr.copy()

    # ---- the state's class distances (Compute_Complete_Metrics.dists), where scipy and scikit-learn are installed
    emb = g.normal(size=(24, 6)); emb /= np.linalg.norm(emb, axis=1, keepdims=True); emb_labels = np.repeat(np.arange(6), 4)
    dists = None if "scipy" in stubbed or "sklearn" in stubbed else \
        np.array(off.Compute_Complete_Metrics.dists(None, emb, emb_labels.reshape(-1, 1)), dtype=float)

    # ---- two more official settings on the same metrics: REINFORCE with the critic, and PPO with the moving-average
    #      baseline (`--policy_dont_use_a2c`); the first update's gradient, the losses, the baselines, the final parameters
    variants = {}
    for tag, mode, a2c in (("reinforce", "reinforce", True), ("ema", "ppo", False)):
        torch.manual_seed(0); np.random.seed(0); call["i"] = 0
        v = off.PADS({**general, "mode": mode}, state_pars, {**policy_pars, "use_a2c": a2c}, sampler_pars, val_pars)
        v.calc_val_metrics = types.SimpleNamespace(compute=compute)
        crit_v = types.SimpleNamespace(); v.assign_sampler(crit_v)
        baselines, orig_ema = [], v.exp_mov_avg
        def ema(vals, alpha, orig_ema=orig_ema, baselines=baselines): b = orig_ema(vals, alpha); baselines.append(b); return b
        v.exp_mov_avg = ema
        init_v, n_draws, n_losses, first_grad = flat(v.policy.parameters()), len(rec.draws), len(captured), None
        torch.Tensor.backward = backward
        v.update(crit_v, None, 0, 0)
        for t in range(args.calls):
            v.update(crit_v, None, 10 * (t + 1), 0)
            if first_grad is None and len(captured) > n_losses: first_grad = flat_grad(v.policy.parameters())
        torch.Tensor.backward = orig_backward
        variants.update({f"{tag}_init_params": init_v, f"{tag}_actions": np.array([d[2] for d in rec.draws[n_draws:]]).reshape(args.calls, K),
                         f"{tag}_losses": np.array(captured[n_losses:]), f"{tag}_first_grad": first_grad,
                         f"{tag}_final_params": flat(v.policy.parameters()), f"{tag}_baselines": np.array(baselines, dtype=float)})

    # ---- the negatives' branches the first batch leaves empty (all after the runs above, so their numbers are unchanged):
    #      (a) the same batch under a p whose edge bins are empty: no mass on the anchor itself nor outside the interval;
    #      (b) `give` on a chosen distance matrix (the sampler's `pdist` returns it): distances exactly on the official grid
    #          points and on ours (`torch.linspace`, one ulp apart at some points), at 0, ties, and outside [0.1, 1.4]
    edge = np.random.default_rng(4).dirichlet(np.ones(K)); edge[[0, -1]] = 0.0
    extra = {}
    for tag, distr, dist_matrix_of, n in (("edge", edge, None, len(batch)), ("grid", np.random.default_rng(5).dirichlet(np.ones(K)), "grid", 16)):
        criterion.sampler.no_norm_distr = distr; criterion.sampler.distr = criterion.sampler.norm(distr)
        lab = labels if tag == "edge" else np.repeat(np.arange(4), 4)
        if dist_matrix_of == "grid":
            gr = np.random.default_rng(6)
            values = np.concatenate([criterion.sampler.support, torch.linspace(0.1, 1.4, K + 1, dtype=torch.float64).numpy(),
                                     [0.0, 0.05, 0.0999, 1.4001, 1.5, 0.7, 0.7, 0.7]])
            dm = gr.choice(values, (n, n)); dm = np.triu(dm, 1); dm = dm + dm.T
            orig_pdist = criterion.sampler.pdist; criterion.sampler.pdist = lambda A, dm=dm: torch.from_numpy(dm)
            b = torch.zeros(n, 2)
        else: b = torch.from_numpy(batch)
        n_draws = len(rec.draws); np.random.seed(7)
        trip = np.array(criterion.sampler.give(b, lab))
        if dist_matrix_of == "grid": criterion.sampler.pdist = orig_pdist
        draws = rec.draws[n_draws:]
        extra.update({f"{tag}_sampler_distr": criterion.sampler.distr, f"{tag}_labels": lab, f"{tag}_triplets": trip,
                      f"{tag}_neg_probs": np.stack([d[0] for d in draws]), f"{tag}_neg_uniforms": np.array([d[1] for d in draws])})
        if dist_matrix_of == "grid": extra.update(grid_distances=dm, grid_support=criterion.sampler.support)

    # ---- the distribution update over a long run of actions, where the official clip of the unnormalised p to
    #      [1e-25, 1e25] binds: bin 0 always alpha, the initial emphasis always beta, the rest 1 (300 calls)
    sampler = off.Parametric_Sampler(**sampler_pars)
    long_actions = np.where(np.arange(K) == 0, 0, np.where(init_distr > 1e-10, 2, 1))
    long_distrs, long_nonorm = [], []
    for _ in range(300):
        sampler.update_sample_distr(np.array(action_values)[long_actions])
        long_distrs.append(sampler.distr.copy()); long_nonorm.append(sampler.no_norm_distr.copy())
    extra.update(long_init=init_distr, long_actions=long_actions, long_distrs=np.stack(long_distrs), long_nonorm_distrs=np.stack(long_nonorm))

    out = args.out; out.mkdir(parents=True, exist_ok=True)
    arrays = dict(metrics=metrics, states=np.stack(states), action_probs=np.stack(probs), actions=np.array(actions),
                  uniforms=np.array(uniforms), losses=np.array(losses), init_params=init_params, grads=np.stack(grads),
                  params_final=params_after[-1], old_params_final=old_params[-1], init_distr=init_distr,
                  old_refresh_call=np.array([t for t in range(len(old_params)) if not np.array_equal(old_params[t], init_params)][0]),
                  distrs=np.stack(distrs), nonorm_distrs=np.stack(nonorm), batch=batch, labels=labels, triplets=triplets,
                  neg_probs=neg_p, neg_uniforms=neg_u, batch_distances=dist_matrix, sampler_distr=sampler_distr,
                  dists_embeddings=emb, dists_labels=emb_labels, **({"dists": dists} if dists is not None else {}), **variants, **extra)
    np.savez_compressed(out / "pads.npz", **arrays)
    meta = {"repository": f"https://github.com/{REPO}", "commit": commit, "script": "tools/parity_pads.py",
            "stubbed_imports": stubbed, "cpu_float64": "Module.cuda returns the module; torch.cuda.FloatTensor is torch.DoubleTensor",
            "functions": {
                "states": where(off.StateMaker.make_state), "state_padding": where(off.PADS.update),
                "action_probs": where(off.Policy.act), "policy_forward": where(off.Policy.forward),
                "losses, grads, params_final, old_params_final, old_refresh_call": where(off.PADS.update),
                "actions, uniforms": where(off.Policy.act), "init_distr": where(off.Parametric_Sampler.probmode),
                "distrs, nonorm_distrs": where(off.Parametric_Sampler.update_sample_distr),
                "triplets, neg_probs, neg_uniforms": where(off.Parametric_Sampler.give),
                "dists": where(off.Compute_Complete_Metrics.dists),
                "reinforce_*, ema_*": where(off.PADS.update), "ema_baselines": where(off.PADS.exp_mov_avg),
                "edge_*, grid_*": where(off.Parametric_Sampler.give), "grid_support": where(off.Parametric_Sampler.__init__),
                "long_*": where(off.Parametric_Sampler.update_sample_distr)},
            "settings": dict(n_bins=K, hidden=hidden, action_values=action_values, history=history, windows=windows,
                             max_iter=max_iter, progress_iters=[10 * (t + 1) for t in range(args.calls)], policy_lr=0.01,
                             ppo_clip=0.2, old_policy_every=5, discount=0.99, support=[0.1, 1.4], include_pos=True,
                             include_same=True, merge_oobs=False, init_distr="uniform_low",
                             param_layout="official order: network.0.weight, network.0.bias, network.2.weight, network.2.bias, "
                                          "action_weights.weight (rows a*K+k), action_weights.bias, value.weight, value.bias"),
            "arrays": {k: list(np.shape(v)) for k, v in arrays.items()}}
    meta["lines"] = cited_lines(args.repo, meta["functions"])
    (out / "pads.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out / 'pads.npz'} ({(out / 'pads.npz').stat().st_size} bytes) and pads.json; commit {commit}")


if __name__ == "__main__": main()
