"Every mode string is a `Literal` alias: the code that checks it accepts exactly the alias's values, and a bad value is named with the choices."
from dataclasses import fields, replace
from types import SimpleNamespace
from typing import Literal, get_args, get_origin, get_type_hints
import pytest, torch
from dml_book.config import FIELD_CHECKS, check_fields, ConfigError, OptimizerName, LRSchedule, LRStepPer, Precision
from dml_book.data.builtin import BuiltinSplit, Digits
from dml_book.data.core import DECODERS, Decoder, EvalProtocol
from dml_book.index import Index, IndexKind, IndexMetric
from dml_book.inference import CheckpointName, checkpoint_file
from dml_book.methods.ala import ALA, StepParameters
from dml_book.methods.dcml import Compositor, Weighting
from dml_book.methods.pads import PADS, BinnedDistribution, InitialDistribution, NegativeSampler, SamplingRule, init_probs
from dml_book.methods.pads_policy import AdvantageBaseline, CriticTarget, PolicyAlgorithm, PolicyLearner
from dml_book.metrics import Distance, Metric, evaluate, knn
from dml_book.models import Head, build_model
from dml_book.registry import DATASETS
from dml_book.train import TrainConfig, _AUTOCAST, _load_registries, build_optimizer, build_scheduler, precision_view


def choices_text(alias) -> str: return "choose from: " + ", ".join(get_args(alias))

LITERAL_FIELDS = {k: t for k, t in get_type_hints(TrainConfig).items() if get_origin(t) is Literal}


def test_the_mode_fields_of_trainconfig_are_literals():
    assert LITERAL_FIELDS == dict(head=Head, optimizer=OptimizerName, lr_schedule=LRSchedule, lr_step_per=LRStepPer,
                                  decoder=Decoder, precision=Precision)
    for f in fields(TrainConfig):   # each default is one of its values
        if f.name in LITERAL_FIELDS: assert f.default in get_args(LITERAL_FIELDS[f.name]), f.name


@pytest.mark.parametrize("name", sorted(LITERAL_FIELDS))
def test_a_literal_field_accepts_exactly_its_values(name):
    values = get_args(LITERAL_FIELDS[name])
    for v in values: check_fields(replace(TrainConfig(), **{name: v}))
    ok, expects = FIELD_CHECKS[name]
    assert [ok(v) for v in ("nope", None, 1, values[0].upper())] == [False] * 4
    with pytest.raises(ConfigError, match=f"{name}='nope' is invalid: expected {', '.join(values[:-1])} or {values[-1]}"):
        check_fields(replace(TrainConfig(), **{name: "nope"}))


def test_the_command_line_lists_the_values_of_each_literal_field():
    from dml_book.cli import choices, parser
    names = choices()
    help = " ".join(next(p for n, p in parser()._subparsers._group_actions[0].choices.items() if n == "train").format_help().split())
    for name, alias in LITERAL_FIELDS.items():
        assert names[name] == list(get_args(alias))
        assert f"one of: {', '.join(get_args(alias))}" in help, name


def test_trainer_builders_take_every_value():
    p = [torch.nn.Parameter(torch.zeros(2))]
    kinds = {v: type(build_optimizer(replace(TrainConfig(), optimizer=v), [{"params": p, "lr": 0.1}])).__name__ for v in get_args(OptimizerName)}
    assert kinds == dict(auto="Adam", adam="Adam", sgd="SGD")
    with pytest.raises(ConfigError, match="unknown optimizer 'rmsprop'; choose from: adam, sgd"):
        build_optimizer(TrainConfig(), [{"params": p, "lr": 0.1}], SimpleNamespace(optimizer_name="rmsprop"))
    opt = torch.optim.SGD(p, lr=0.1)
    for s in get_args(LRSchedule):
        for per in get_args(LRStepPer):
            sched = build_scheduler(opt, replace(TrainConfig(), lr_schedule=s, lr_step_per=per, lr_milestones=(1,)))
            assert (sched is None) == (s == "constant")
    with pytest.raises(ConfigError, match=f"unknown lr_step_per 'batch'; {choices_text(LRStepPer)}"):
        build_scheduler(opt, replace(TrainConfig(), lr_step_per="batch"))


def test_precision_view_takes_every_precision_and_autocasts_the_16_bit_ones():
    assert set(_AUTOCAST) == set(get_args(Precision)) - {"fp32", "auto"}   # auto resolves to bf16 or fp32
    for v in get_args(Precision): assert precision_view(SimpleNamespace(), v).scaler.is_enabled() == (v == "fp16")
    with pytest.raises(ValueError, match=f"unknown precision 'fp8'; {choices_text(Precision)}"): precision_view(SimpleNamespace(), "fp8")


def test_models_data_and_datasets():
    dims = {h: build_model("smallcnn", 128, head=h)(torch.zeros(2, 1, 16, 16)).shape for h in get_args(Head)}
    assert dims == dict(linear=(2, 128), identity=(2, 128))
    with pytest.raises(ValueError, match=f"unknown head 'mlp'; {choices_text(Head)}"): build_model(head="mlp")
    assert set(DECODERS) == set(get_args(Decoder))
    _load_registries()
    protocols = {n: DATASETS.get(n).protocol for n in DATASETS.names()}
    assert set(protocols.values()) == set(get_args(EvalProtocol)), protocols   # every protocol is one, and each is used
    assert [len(Digits(split=s).class_names) for s in get_args(BuiltinSplit)] == [5, 5]
    with pytest.raises(ValueError, match=f"unknown split 'val'; {choices_text(BuiltinSplit)}"): Digits(split="val")


def test_check_config_refuses_a_dataset_with_an_unknown_protocol():
    from dml_book.config import check_config
    from dml_book.registry import DATASETS
    class Odd(Digits): protocol = "ranking"
    DATASETS._items["odd-protocol"] = Odd
    try:
        with pytest.raises(ConfigError, match=f"dataset 'odd-protocol' has no evaluation protocol 'ranking'; {choices_text(EvalProtocol)}"):
            check_config(replace(TrainConfig(), dataset="odd-protocol"))
    finally: del DATASETS._items["odd-protocol"]


def test_metrics_take_every_distance_and_metric():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 4, generator=g), torch.arange(40) % 5
    for d in get_args(Distance): assert knn(x, 3, distance=d)[1].shape == (40, 3)
    with pytest.raises(ValueError, match=f"unknown distance 'manhattan'; {choices_text(Distance)}"): knn(x, 3, distance="manhattan")
    for m in get_args(Metric):
        out = evaluate(x, y, ks=(1,), metrics=(m,), gpus=None)
        assert list(out) == (["R@1"] if m == "R@K" else [m])


def test_index_and_inference_choices(tmp_path):
    for m in get_args(IndexMetric):
        for k in get_args(IndexKind): assert Index(8, metric=m, kind=k).kind == k
    with pytest.raises(ValueError, match=f"unknown index kind 'lsh'; {choices_text(IndexKind)}"): Index(8, kind="lsh")
    with pytest.raises(ValueError, match=f"unknown metric 'cos'; {choices_text(IndexMetric)}"): Index(8, metric="cos")
    (tmp_path/"checkpoint.pt").write_bytes(b""); (tmp_path/"best.pt").write_bytes(b"")
    assert [checkpoint_file(tmp_path, c).name for c in get_args(CheckpointName)] == ["best.pt", "checkpoint.pt"]
    with pytest.raises(ConfigError, match=f"unknown checkpoint 'first'; {choices_text(CheckpointName)}"): checkpoint_file(tmp_path, "first")


def test_method_choices():
    for s in get_args(StepParameters): assert ALA(step=s).step == s
    with pytest.raises(ValueError, match=f"unknown step 'backbone'; {choices_text(StepParameters)}"): ALA(step="backbone")
    for w in get_args(Weighting): assert Compositor(8, 2, 3, weighting=w).weighting_fn == w
    with pytest.raises(ValueError, match=f"unknown weighting 'exp'; {choices_text(Weighting)}"): Compositor(8, 2, 3, weighting="exp")
    for a in get_args(PolicyAlgorithm):
        for b in get_args(AdvantageBaseline): assert (PolicyLearner(10, algorithm=a, baseline=b).algorithm) == a
    with pytest.raises(ValueError, match=f"unknown algorithm 'dqn'; {choices_text(PolicyAlgorithm)}"): PolicyLearner(10, algorithm="dqn")
    with pytest.raises(ValueError, match=f"unknown baseline 'none'; {choices_text(AdvantageBaseline)}"): PolicyLearner(10, baseline="none")
    for r in get_args(SamplingRule): assert BinnedDistribution(rule=r).rule == r
    with pytest.raises(ValueError, match=f"unknown sampling rule 'weighted'; {choices_text(SamplingRule)}"): BinnedDistribution(rule="weighted")
    centers = BinnedDistribution().centers
    for i in get_args(InitialDistribution): torch.testing.assert_close(init_probs(i, centers).sum(), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match=f"unknown initial distribution 'beta'; {choices_text(InitialDistribution)}"): init_probs("beta", centers)
    for c in get_args(CriticTarget): assert PolicyLearner(10, critic=c).critic == c
    with pytest.raises(ValueError, match=f"unknown critic 'mc'; {choices_text(CriticTarget)}"): PolicyLearner(10, critic="mc")
    for s in get_args(NegativeSampler): assert PADS(sampler=s, adapt=s == "binned").sampler == s
    with pytest.raises(ValueError, match=f"unknown sampler 'semihard'; {choices_text(NegativeSampler)}"): PADS(sampler="semihard")
