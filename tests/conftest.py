"Fixtures shared by the test modules, and the order the files run in."
import json
from collections import defaultdict
from pathlib import Path
import pytest
import torch


@pytest.fixture
def one_thread():
    "One torch thread (tiny tensors: extra threads only spin on a shared CPU); thread count and default dtype restored after."
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    try: yield
    finally: torch.set_num_threads(threads); torch.set_default_dtype(dtype)


# `make test` runs whole files on each worker (pytest-xdist --dist loadfile), handed out in collection order: a heavy
# file collected last keeps one worker busy while the other idles. So the heaviest files go first (longest processing
# time first), by the seconds each file took when it last ran whole on this machine (pytest's cache), else by those
# stored in tests/file_seconds.json (a fresh clone: copy the cache's `dml_book/file_seconds` there after a full run). The summary prints the slowest files and each worker's load.
CACHE_KEY, STORED = "dml_book/file_seconds", Path(__file__).with_name("file_seconds.json")
_seconds, _workers = defaultdict(float), defaultdict(float)

def _file(nodeid: str) -> str: return nodeid.split("::")[0].split("[")[0]

def _cache(config): return getattr(config, "cache", None)   # None under `-p no:cacheprovider`

def pytest_collection_modifyitems(config, items):
    cache = _cache(config)
    weights = (cache and cache.get(CACHE_KEY, None)) or (json.loads(STORED.read_text()) if STORED.is_file() else {})
    items.sort(key=lambda item: -weights.get(_file(item.nodeid), 0.0))   # stable: within a file, the written order

def pytest_runtest_logreport(report):
    _seconds[_file(report.nodeid)] += report.duration
    node = getattr(report, "node", None)   # the xdist worker that ran it (on the controller)
    if node is not None: _workers[node.gateway.id] += report.duration

def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not _seconds: return
    cache = _cache(config)
    if cache and not config.option.keyword and not config.option.markexpr:   # whole files ran: remember their seconds
        cache.set(CACHE_KEY, {**(cache.get(CACHE_KEY, None) or {}), **{f: round(s, 1) for f, s in _seconds.items()}})
    top = sorted(_seconds.items(), key=lambda kv: -kv[1])[:12]
    terminalreporter.write_sep("=", "slowest files (seconds, all phases)")
    for f, s in top: terminalreporter.write_line(f"{s:8.1f}  {f}")
    if _workers: terminalreporter.write_line("busy per worker: " + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_workers.items())))


@pytest.fixture
def no_hang():
    "A read that blocks (a FIFO opened without O_NONBLOCK) fails the test after 30 s instead of hanging the suite."
    import signal
    def stop(*_): raise TimeoutError("a read blocked")
    old = signal.signal(signal.SIGALRM, stop); signal.alarm(30)
    yield
    signal.alarm(0); signal.signal(signal.SIGALRM, old)
