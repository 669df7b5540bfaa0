"Tests of the DMML chapter (dml_book.methods.dmml): set distances, the episode loss, episodes, training and re-id."
import math
import numpy as np
import pytest
from dml_book.checkpoint import read_checkpoint
import torch
import torch.nn.functional as F

from dml_book.methods.dmml import (DMML, EpisodeBaseline, MetaCellLoss, episode_loss, meta_cell_distances,
                                   split_episode)
from dml_book.samplers import TaskSampler


def brute_force_distances(query, support, support_labels, mode, query_labels=None):
    "Eqs. (9) and (10) read literally, one query and one class at a time, in float64."
    q, s = query.double(), support.double()
    classes = sorted(set(support_labels.tolist()))
    out = np.zeros((len(q), len(classes)))
    for i in range(len(q)):
        for j, c in enumerate(classes):
            cell = s[support_labels == c]
            if mode == "center":
                out[i, j] = float(((q[i] - cell.mean(0)) ** 2).sum())
            else:
                d = [float(((q[i] - x) ** 2).sum()) for x in cell]
                out[i, j] = max(d) if c == int(query_labels[i]) else min(d)
    return out


@pytest.mark.parametrize("mode", ["center", "hard"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_meta_cell_distances_brute_force(mode, seed):
    g = torch.Generator().manual_seed(seed)
    n_cls, n_s, dim = 3 + seed, 2 + seed, 5
    labels = torch.randperm(50, generator=g)[:n_cls]                      # arbitrary, unsorted class ids
    support_labels = labels.repeat_interleave(n_s)[torch.randperm(n_cls * n_s, generator=g)]
    support = torch.randn(n_cls * n_s, dim, generator=g) * 2
    query_labels = labels[torch.randint(0, n_cls, (7,), generator=g)]
    query = torch.randn(7, dim, generator=g) * 2
    got = meta_cell_distances(query, support, support_labels, mode, query_labels)
    want = brute_force_distances(query, support, support_labels, mode, query_labels)
    assert got.shape == (7, n_cls)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_hard_distance_bounds_center_distance():
    "Own class: the distance to the centre is at most the mean distance to the supports, hence at most the farthest."
    g = torch.Generator().manual_seed(5)
    support, support_labels = torch.randn(12, 4, generator=g), torch.arange(4).repeat_interleave(3)
    query, query_labels = torch.randn(8, 4, generator=g), torch.arange(4).repeat(2)
    center = meta_cell_distances(query, support, support_labels, "center")
    hard = meta_cell_distances(query, support, support_labels, "hard", query_labels)
    own = F.one_hot(query_labels, 4).bool()
    assert (hard[own] >= center[own] - 1e-5).all()    # ||x - mean||^2 <= mean of ||x - s||^2 <= max


def test_meta_cell_distances_errors():
    s, sl, q = torch.zeros(4, 2), torch.tensor([0, 0, 1, 1]), torch.zeros(1, 2)
    with pytest.raises(ValueError, match="needs query_labels"):
        meta_cell_distances(q, s, sl, "hard")
    with pytest.raises(ValueError, match="query label 3 has no meta-cell"):
        meta_cell_distances(q, s, sl, "hard", torch.tensor([3]))
    with pytest.raises(ValueError, match="unknown set distance 'mean'"):
        meta_cell_distances(q, s, sl, "mean")
    with pytest.raises(ValueError, match=r"need query \(Q, D\)"):
        meta_cell_distances(torch.zeros(1, 3), s, sl)


def formula_loss(d, t, tau, variant):
    "Eq. (7) and the Table 4 variants, written out with math.exp, one query at a time."
    total = 0.0
    for i, row in enumerate(d.tolist()):
        y = int(t[i])
        pos = -row[y] - (tau if variant == "positive" else 0.0)
        negs = [-v for c, v in enumerate(row) if c != y]
        if variant == "negative":
            negs = [min(n + tau, 0.0) for n in negs]             # the constraint -d_n = min(-d + tau, 0)
        total += -math.log(math.exp(pos) / (math.exp(pos) + sum(math.exp(n) for n in negs)))
    return total / len(d)


@pytest.mark.parametrize("variant", ["none", "positive", "negative"])
@pytest.mark.parametrize("tau", [0.0, 0.4, 1.3])
def test_episode_loss_formula(variant, tau):
    g = torch.Generator().manual_seed(3)
    d = torch.rand(6, 5, generator=g) * 3                       # some negatives below tau, some above
    t = torch.randint(0, 5, (6,), generator=g)
    assert episode_loss(d, t, tau, variant).item() == pytest.approx(formula_loss(d, t, tau, variant), rel=1e-5)


def test_margin_constraint():
    d, t = torch.tensor([[1.0, 0.1, 0.3, 2.0]]), torch.tensor([0])
    # negatives 0.1 and 0.3 are within tau = 0.4: their logits clip to 0; 2.0 gives -1.6
    want = -math.log(math.exp(-1.0) / (math.exp(-1.0) + 2 * math.exp(0.0) + math.exp(-1.6)))
    assert episode_loss(d, t, 0.4).item() == pytest.approx(want, rel=1e-6)
    dd = d.clone().requires_grad_()
    episode_loss(dd, t, 0.4).backward()
    assert dd.grad[0, 1] == 0 and dd.grad[0, 2] == 0               # clipped negatives carry no gradient
    assert dd.grad[0, 0] > 0 and dd.grad[0, 3] < 0                 # pull the positive in, push the negative out
    # the margin makes the loss larger than the plain softmax unless every negative is clipped
    assert episode_loss(d, t, 0.4).item() > episode_loss(d, t, 0.4, "none").item()
    with pytest.raises(ValueError, match="margin must be >= 0"):
        episode_loss(d, t, -1.0)


def test_meta_cell_loss_module_matches_pieces():
    g = torch.Generator().manual_seed(4)
    lab = torch.tensor([2, 7, 2, 7, 2, 7, 5, 5, 5])           # 3 classes x (2 support + 1 query), interleaved
    emb = torch.randn(9, 6, generator=g)
    ep = split_episode(emb, lab, 2)
    for mode in ("center", "hard"):
        d = brute_force_distances(ep.query, ep.support, ep.support_labels, mode, ep.query_labels)
        t = torch.tensor([[2, 5, 7].index(int(c)) for c in ep.query_labels])
        want = formula_loss(torch.tensor(d), t, 0.4, "negative")
        assert MetaCellLoss(2, mode)(emb, lab).item() == pytest.approx(want, rel=1e-5)


def test_episodes_have_the_promised_shape():
    from dml_book.data import Glyphs
    labels = Glyphs(split="train").labels
    m, n_s, n_q, dim = 32, 5, 1, 8
    sampler = TaskSampler(labels, n_classes=m, n_support=n_s, n_query=n_q, seed=0)
    for task in list(sampler)[:3]:
        assert len(task) == m * (n_s + n_q)
        lab = torch.as_tensor(labels[task])
        blocks = lab.view(m, n_s + n_q)
        assert (blocks == blocks[:, :1]).all() and len(set(blocks[:, 0].tolist())) == m   # class by class
        emb = torch.arange(len(task), dtype=torch.float)[:, None].expand(-1, dim)
        ep = split_episode(emb, lab, n_s)
        assert ep.support.shape == (m * n_s, dim) and ep.query.shape == (m * n_q, dim)
        assert ep.support_labels.unique(return_counts=True)[1].eq(n_s).all()
        # the support of each class is its first n_s positions, the query the last n_q
        pos = ep.query[:, 0].long()
        assert ((pos % (n_s + n_q)) >= n_s).all()
        d = meta_cell_distances(ep.query, ep.support, ep.support_labels, "hard", ep.query_labels)
        assert d.shape == (m * n_q, m)


def test_split_episode_needs_queries():
    with pytest.raises(ValueError, match="class 1 has 2 images in the episode; needs more than n_support=2"):
        split_episode(torch.zeros(5, 2), torch.tensor([0, 0, 0, 1, 1]), 2)


def test_the_paper_schedule_is_the_runs_half_exp():
    "Sec. 3.2 as the presets' run schedule: constant for the first 600 of 1200 epochs, then exponential to 0.005x."
    from dml_book.train import build_scheduler, preset_config
    cfg = preset_config("dmml", "market1501")
    assert (cfg.lr_schedule, cfg.lr_final_fraction, cfg.lr_warmup_epochs, cfg.lr_step_per) == ("half_exp", 0.005, 0, "epoch")
    assert "lr_decay" not in cfg.method_kwargs
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    sched, f = build_scheduler(opt, cfg), []
    for _ in range(1200): f.append(opt.param_groups[0]["lr"] / 2e-4); opt.step(); sched.step()
    assert f[:600] == [1.0] * 600
    assert f[-1] == pytest.approx(0.005)
    ratios = np.array(f[600:]) / np.array(f[599:-1])
    np.testing.assert_allclose(ratios, 0.005 ** (1 / 600), rtol=1e-9)   # exponential decay over the second half
    with pytest.raises(TypeError): DMML(lr_decay=True)                   # the method has no schedule of its own


def test_method_step_equals_manual_step():
    "One trainer step on DMML.batch_loss == one Adam step on MetaCellLoss of the scaled, unnormalised embedding."
    from types import SimpleNamespace
    from dml_book.models import build_model
    from dml_book.train import Trainer, precision_view

    def stand_in():
        torch.manual_seed(0)
        model = build_model("smallcnn", embedding_dim=8)
        return precision_view(SimpleNamespace(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), epoch=1,
                               cfg=SimpleNamespace(epochs=2, seed=0), gather=lambda z, labels: (z, labels)))
    method, tr, ref = DMML(n_classes=2, n_support=2, n_query=1, scale=3.0), stand_in(), stand_in()
    method.setup(tr); tr.method = method
    x, y = torch.randn(6, 1, 16, 16), torch.tensor([4, 4, 4, 1, 1, 1])
    logs = Trainer.training_step(tr, x, y)
    ref.model.head.normalize = False
    loss = MetaCellLoss(2, "hard", 0.4)(3.0 * ref.model(x), y)
    loss.backward(); ref.optimizer.step()
    assert logs["loss"] == pytest.approx(loss.item(), rel=1e-5)
    torch.testing.assert_close(tr.model.head.fc.weight, ref.model.head.fc.weight)
    tr.epoch = 2                                                   # the last epoch of 2: the method leaves the rate alone
    Trainer.training_step(tr, x, y)
    assert tr.optimizer.param_groups[0]["lr"] == 1e-3 and "initial_lr" not in tr.optimizer.param_groups[0]


def test_presets_are_train_configs():
    from dml_book.train import preset_config
    for name, dataset in (("market1501", "market1501"), ("dukemtmc", "dukemtmc"), ("veri776", "veri776")):
        cfg = preset_config("dmml", name)
        assert cfg.dataset == dataset and cfg.backbone == "resnet50" and cfg.lr_backbone == 2e-4
        assert cfg.weight_decay == 1e-4 and cfg.epochs == 1200
        m = cfg.method_kwargs
        assert (m["n_classes"], m["n_support"], m["n_query"], m["margin"], m["distance"]) == (32, 5, 1, 0.4, "hard")
        # Sec. 4.1: the pooled ResNet-50 feature is the embedding (no Linear head), last down-sampling removed
        assert (cfg.head, cfg.last_stride, cfg.embedding_dim) == ("identity", 1, 2048)
        DMML(**m)                                                  # the kwargs construct the method


def test_vehicle_and_person_pipelines_follow_the_paper():
    "Sec. 4.1: people at 256 x 128 with flips and random erasing; Sec. 4.2: vehicles at 224 x 224 with flips only."
    from torchvision import transforms as T
    from dml_book.data.reid import Market1501, VeRi776
    kinds = lambda t: [type(s).__name__ for s in t.transforms]
    veri, market = VeRi776.default_transform(True), Market1501.default_transform(True)
    assert "RandomErasing" not in kinds(veri) and "RandomHorizontalFlip" in kinds(veri)
    assert "RandomErasing" in kinds(market)
    from PIL import Image
    img = Image.new("RGB", (300, 180), (120, 60, 30))
    assert veri(img).shape == (3, 224, 224) and VeRi776.default_transform(False)(img).shape == (3, 224, 224)
    assert market(img).shape == (3, 256, 128)


def test_market_preset_takes_one_step_on_the_replica(tmp_path):
    "The paper's Market-1501 preset, without pretrained weights, trains one episode on the archive's layout (a small episode)."
    from dml_book.data.replicas import write_market
    from dml_book.train import Trainer, preset_config
    write_market(tmp_path/"data", train_ids=range(2, 8), test_ids=(11, 12), n_cams=3, per_cam=2)
    cfg = preset_config("dmml", "market1501", data_root=str(tmp_path/"data"), pretrained=False, epochs=1,
                        max_steps_per_epoch=1, device="cpu", out=str(tmp_path/"run"))
    cfg.method_kwargs.update(n_classes=2, n_support=1, n_query=1, tasks_per_epoch=1)   # 4 images: one CPU step
    tr = Trainer(cfg)
    assert type(tr.model.head.fc).__name__ == "Identity" and tr.model.backbone.layer4[0].conv2.stride == (1, 1)
    metrics = tr.fit()
    assert sorted(metrics) == ["CMC@1", "CMC@10", "CMC@5", "mAP"] and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.slow
def test_short_run_improves_recall(tmp_path):
    "20 episodes of 8 x (3 + 1) Glyphs images beat the untrained network (same seed, epoch-0 evaluation)."
    import json
    from dml_book.train import TrainConfig, train
    cfg = TrainConfig(dataset="glyphs", method="dmml", epochs=1, max_steps_per_epoch=20, seed=0, out=str(tmp_path),
                      method_kwargs=dict(n_classes=8, n_support=3, n_query=1))
    final = train(cfg)
    summary = json.loads((tmp_path/"metrics.json").read_text())
    steps = [json.loads(line) for line in (tmp_path/"log.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert len(steps) == 20 and {"loss", "d_pos", "d_neg", "episode_acc"} <= set(steps[0])
    assert final["R@1"] > summary["untrained"]["R@1"] + 0.05, (summary["untrained"]["R@1"], final["R@1"])


@pytest.mark.slow
@pytest.mark.parametrize("dataset,writer", [("market1501", "write_market"), ("dukemtmc", "write_duke"),
                                            ("veri776", "write_veri")])
def test_reid_end_to_end_on_replicas(tmp_path, dataset, writer):
    "DMML on a generated re-id archive; the trainer reports reid_evaluate of flip-averaged normalised features."
    from dml_book.data import replicas
    from dml_book.data.transforms import reid_transform
    from dml_book.reid_metrics import flip_averaged_features, reid_evaluate
    from dml_book.train import TrainConfig, Trainer
    getattr(replicas, writer)(tmp_path/"data", train_ids=range(2, 10), test_ids=(11, 12, 13, 14), n_cams=3, per_cam=2)
    cfg = TrainConfig(dataset=dataset, data_root=str(tmp_path/"data"), method="dmml", epochs=1, seed=0,
                      embedding_dim=16, out=str(tmp_path/"run"),
                      method_kwargs=dict(n_classes=4, n_support=4, n_query=2, flip_test=True))
    tr = Trainer(cfg)
    for ds in (tr.train_ds, tr.query_ds, tr.gallery_ds):
        ds.transform = reid_transform(ds is tr.train_ds, size=(32, 16))
    assert len(tr.sampler) == len(tr.train_ds) // (4 * 6)
    batch = next(iter(tr.sampler))
    assert len(batch) == 4 * (4 + 2) and len(set(tr.train_ds.labels[batch].tolist())) == 4
    metrics = tr.fit()
    assert sorted(metrics) == ["CMC@1", "CMC@10", "CMC@5", "mAP"]
    feats = {}
    for name, ds in (("query", tr.query_ds), ("gallery", tr.gallery_ds)):
        x = torch.stack([ds[i][0] for i in range(len(ds))])
        feats[name] = F.normalize(flip_averaged_features(tr.model, x), dim=-1)
    want = reid_evaluate(feats["query"], tr.query_ds.pids, tr.query_ds.camids,
                         feats["gallery"], tr.gallery_ds.pids, tr.gallery_ds.camids)
    for k, v in want.items():
        assert metrics[k] == pytest.approx(v, abs=1e-6)
    assert 0 < metrics["mAP"] <= 1 and metrics["CMC@1"] <= metrics["CMC@5"] <= metrics["CMC@10"]


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(tmp_path):
    "Two epochs in one go == the same run stopped after its first epoch and resumed, on the run's half_exp schedule."
    from dml_book.train import TrainConfig, Trainer, train
    kw = dict(dataset="digits", method="dmml", seed=0, max_steps_per_epoch=3, epochs=2, lr_schedule="half_exp",
              lr_final_fraction=0.005, method_kwargs=dict(n_classes=5, n_support=3, n_query=1))
    train(TrainConfig(out=str(tmp_path/"straight"), **kw))
    class Stop(Exception): pass
    cut = Trainer(TrainConfig(out=str(tmp_path/"resumed"), **kw)); save = cut.save_checkpoint
    def save_then_stop():
        save()
        if cut.epoch == 1: raise Stop                                  # interrupted after the first epoch
    cut.save_checkpoint = save_then_stop
    with pytest.raises(Stop): cut.fit()
    resumed = Trainer(TrainConfig(out=str(tmp_path/"resumed"), **kw))
    resumed.fit()
    a = read_checkpoint(tmp_path/"straight"/"checkpoint.pt")
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.005)
    for k, v in a["model"].items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, rtol=0, atol=0)


def test_trainer_uses_the_meta_cell_loss_and_refuses_a_configured_one(tmp_path):
    "DMML trains with its own objective: the trainer's loss_fn is the method's, and a loss or miner in the config is refused."
    from dml_book.train import ConfigError, Trainer, TrainConfig
    kw = dict(dataset="digits", method="dmml", epochs=1, out=str(tmp_path), method_kwargs=dict(n_classes=2, n_support=2))
    trainer = Trainer(TrainConfig(**kw))
    assert trainer.loss_fn is trainer.method.loss and trainer.miner is None
    for bad, named in ((dict(loss="contrastive"), "loss='contrastive'"), (dict(miner="batchhard"), "miner='batchhard'"),
                       (dict(loss_kwargs={"margin": 0.3}), "loss_kwargs={'margin': 0.3}")):
        with pytest.raises(ConfigError, match="own meta-cell loss") as e: Trainer(TrainConfig(**kw, **bad))
        assert named in str(e.value)


def _view(labels, seed=0, world=1, rank=0):
    from types import SimpleNamespace
    return SimpleNamespace(train_ds=SimpleNamespace(labels=np.asarray(labels)), cfg=SimpleNamespace(seed=seed),
                           dist=SimpleNamespace(world_size=world, rank=rank))


@pytest.mark.parametrize("seed", [0, 5])
def test_episode_baseline_draws_dmmls_batches(seed):
    "Table 3's baselines train on DMML's sampler: the same episodes, epoch by epoch, also split across ranks."
    labels = np.repeat(np.arange(20), [2, 3, 4, 5, 6] * 4)
    for world, rank in ((1, 0), (2, 1)):
        ours = EpisodeBaseline(n_classes=8, n_support=3, tasks_per_epoch=5).batch_sampler(_view(labels, seed, world, rank))
        theirs = DMML(n_classes=8, n_support=3, tasks_per_epoch=5).batch_sampler(_view(labels, seed, world, rank))
        for e in range(3):
            ours.set_epoch(e); theirs.set_epoch(e)
            batches = list(ours)
            assert batches == list(theirs) and len(batches) == 5
            assert all(len(b) == 8 * 4 // world and len(set(labels[b])) == 8 // world for b in batches)
    with pytest.raises(ValueError, match="n_classes, n_support and n_query must be >= 1"): EpisodeBaseline(n_support=0)


def test_episode_baseline_trains_the_configured_loss_with_its_miner(tmp_path):
    "method=episodes: the configured loss and miner (batch-hard, mean over the anchors) on the episode, normalised embedding."
    from dml_book.train import ConfigError, Trainer, TrainConfig
    kw = dict(dataset="digits", method="episodes", epochs=1, max_steps_per_epoch=2, seed=1, out=str(tmp_path),
              loss="triplet", loss_kwargs=dict(margin=0.2, reduction="mean"), miner="batchhard",
              method_kwargs=dict(n_classes=4, n_support=3, n_query=1))
    tr = Trainer(TrainConfig(**kw))
    assert isinstance(tr.method, EpisodeBaseline) and type(tr.miner).__name__ == "BatchHardMiner" and tr.model.head.normalize
    dmml = Trainer(TrainConfig(**{**kw, "method": "dmml", "loss_kwargs": {}, "miner": None, "out": str(tmp_path/"d")}))
    assert list(tr.sampler) == list(dmml.sampler)                                # seed for seed, DMML's episodes
    idx = next(iter(tr.sampler))
    x = torch.stack([tr.train_ds[i][0] for i in idx]); y = torch.as_tensor(tr.train_ds.labels[idx])
    with torch.no_grad():
        z = tr.model(x)
        d = torch.cdist(z, z)
    same = y[:, None] == y[None]
    pos = d.masked_fill(~same, -1.0).amax(1); neg = d.masked_fill(same, float("inf")).amin(1)
    logs = tr.training_step(x, y)
    assert logs["loss"] == pytest.approx(torch.relu(pos - neg + 0.2).mean().item(), rel=1e-5)
    with pytest.raises(ConfigError, match="loss"):
        Trainer(TrainConfig(**{**kw, "loss_kwargs": {"margn": 0.2}}))                # a bad loss argument: one line, named


def test_study_arms_differ_only_in_what_they_change(tmp_path):
    "DMML.study_arms: baseline and dmml share batches and schedule; each other arm changes what its name says."
    arms = DMML.study_arms
    assert set(arms) == {"baseline", "dmml", "all-triplet", "dmml-episode-shape", "dmml-normalised"}
    assert set(DMML.attribution) == set(arms) - {"baseline", "dmml"}
    b, m = arms["baseline"], arms["dmml"]
    assert (b["method"], b["miner"], b["loss"], b["loss_kwargs"]) == ("episodes", "batchhard", "triplet", dict(margin=0.2, reduction="mean"))
    assert b["method_kwargs"] == m["method_kwargs"] == dict(n_classes=16, n_support=3, n_query=1)
    from dml_book.study_design import STUDY_SETTINGS
    assert 16 * (3 + 1) == STUDY_SETTINGS["batch_size"]                           # an episode is the study's batch
    assert arms["dmml-episode-shape"]["method_kwargs"] == dict(m["method_kwargs"], n_classes=32)
    assert arms["dmml-normalised"]["method_kwargs"] == dict(m["method_kwargs"], normalize_train=True)
    assert arms["all-triplet"] == dict(method="baseline", loss="triplet")          # the study's class-balanced batches
    arms["dmml"]["method_kwargs"]["n_classes"] = 99                              # a copy per arm: editing one edits no other
    try: assert arms["baseline"]["method_kwargs"]["n_classes"] == 16
    finally: arms["dmml"]["method_kwargs"]["n_classes"] = 16
