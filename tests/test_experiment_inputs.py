"""`dml-book experiment` checks its parameter file, its notebook and its kernel before any kernel starts (issue 72, item 7):
each malformed input is one line on stderr and exit status 2, and papermill is never called."""
import os
import nbformat, pytest

DEEP = "seeds: " + "[" * 3000 + "]" * 3000 + "\n"   # PyYAML recurses once per level: RecursionError unchecked
BOMB = "a: &a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(7))   # 10^8 items

PARAMS = [("a list", "- 1\n- 2\n", "holds a list, not a mapping of parameter names"),
          ("a string", "seeds\n", "holds a str, not a mapping"),
          ("bad syntax", "seeds: [0, 1\n", "is not valid YAML"),
          ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not UTF-8 text"),
          ("a Python tag", "seeds: !!python/object/apply:os.system [echo owned]\n", "is not valid YAML (could not determine a constructor"),
          ("deep nesting", DEEP, "nests"),
          ("a huge list", BOMB, "holds more than 100000 items")]


pytestmark = pytest.mark.usefixtures("no_hang")   # a blocking read fails after 30 s (tests/conftest.py)


@pytest.fixture
def no_kernel(monkeypatch):
    "papermill's execute_notebook replaced by one that fails the test: nothing may reach a kernel."
    import papermill
    def started(*a, **k): raise AssertionError("a kernel was started")
    monkeypatch.setattr(papermill, "execute_notebook", started)


def notebook(path, parameters='out_dir: str = "runs"\nseeds: list = [0]  # the seeds'):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell("print(seeds)")]
    nbformat.write(nb, str(path)); return path


def experiment(capsys, *args):
    "`dml-book experiment ARGS` in this process: its exit status and its stderr."
    from dml_book.cli import main
    rc = main(["experiment", *map(str, args), "--no-progress"])
    return rc, capsys.readouterr().err


def one_line(rc, err, said):
    assert rc == 2 and err.count("\n") == 1 and err.startswith("dml-book: error:") and said in err, (rc, err[-2000:])
    assert "Traceback" not in err


@pytest.mark.parametrize("case,text,said", PARAMS, ids=[p[0] for p in PARAMS])
def test_a_malformed_parameter_file_is_one_line(tmp_path, capsys, no_kernel, case, text, said):
    nb, p = notebook(tmp_path/"tiny.ipynb"), tmp_path/"p.yaml"
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    one_line(*experiment(capsys, nb, "--parameters-file", p, "--out-dir", tmp_path/"out"), said)


def test_a_fifo_for_a_parameter_file_or_a_notebook_is_refused_without_blocking(tmp_path, capsys, no_kernel):
    nb = notebook(tmp_path/"tiny.ipynb"); os.mkfifo(tmp_path/"p.yaml")
    one_line(*experiment(capsys, nb, "--parameters-file", tmp_path/"p.yaml", "--out-dir", tmp_path/"out"), "is a FIFO (named pipe), not a regular file")
    os.mkfifo(tmp_path/"fifo.ipynb")
    one_line(*experiment(capsys, tmp_path/"fifo.ipynb", "--out-dir", tmp_path/"out"), "notebook")


def test_an_unknown_kernel_is_one_line(tmp_path, capsys, no_kernel):
    one_line(*experiment(capsys, notebook(tmp_path/"tiny.ipynb"), "--kernel", "no-such-kernel", "--out-dir", tmp_path/"out"), "unknown kernel 'no-such-kernel'; choose from:")


def test_a_notebook_that_is_not_json_or_whose_parameters_cell_does_not_parse_is_one_line(tmp_path, capsys, no_kernel):
    (tmp_path/"text.ipynb").write_text("print('hello')\n")
    one_line(*experiment(capsys, tmp_path/"text.ipynb", "--out-dir", tmp_path/"out"), "is not a Jupyter notebook (NotJSONError)")
    nb = notebook(tmp_path/"broken.ipynb", 'out_dir: str = "runs"\nseeds: list = [0,  # a bracket left open')
    one_line(*experiment(capsys, nb, "--out-dir", tmp_path/"out"), "its parameters cell is not valid Python")


def test_a_command_line_value_is_bounded_too(tmp_path, capsys, no_kernel):
    nb = notebook(tmp_path/"tiny.ipynb")
    one_line(*experiment(capsys, nb, "-p", "seeds", "[" * 3000 + "]" * 3000, "--out-dir", tmp_path/"out"), "seeds")
    one_line(*experiment(capsys, nb, "-p", "seeds", "[0, 1", "--out-dir", tmp_path/"out"), "parameter seeds: '[0, 1' is not a value YAML can read")
