"""On a GPU: the methods whose state holds a random generator or a policy state train and resume there.

Skipped without CUDA. Seen failing on an H200 before the fix: a checkpoint read with `map_location=cuda` put the
generators' states (CPU byte tensors) on the GPU, so ALA, HDML and PADS could not resume; PADS's policy state mixed
a CPU history with GPU bin probabilities, its actions were drawn from GPU probabilities with a CPU generator, its critic's
target was a CPU tensor, and its metric history came back from a checkpoint on the GPU."""
import pytest, torch
from dml_book.train import Trainer, TrainConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

RUNS = {
    "ala": dict(max_steps_per_epoch=3, m_per_class=10, method_kwargs=dict(n_train=30, n_val=20, max_tuples=64)),
    "hdml": dict(batch_size=20, m_per_class=4, embedding_dim=16, max_steps_per_epoch=6, method_kwargs=dict(hidden=32, window=4)),
    "pads": dict(batch_size=20, m_per_class=4, max_steps_per_epoch=6, embedding_dim=16, method_kwargs=dict(update_every=3)),
}


@pytest.mark.parametrize("method", sorted(RUNS))
def test_a_run_resumes_on_the_gpu(tmp_path, method):
    "One epoch, then the same folder asked for two: the second call resumes from the checkpoint on the GPU and ends."
    kw = dict(dataset="glyphs", method=method, device="cuda", seed=0, eval_every=1, out=str(tmp_path), **RUNS[method])
    Trainer(TrainConfig(epochs=1, **kw)).fit()
    tr = Trainer(TrainConfig(epochs=2, **kw)); tr.fit()
    assert tr.epoch == 2 and tr.device.type == "cuda"
