"""What the project's own pages tell a newcomer holds in a fresh clone: CONTRIBUTING's files and one-chapter command, the
Quarto configuration's word on saved outputs, and one wording of how to install, wherever a page or a message says it."""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INSTALL = "pip install --extra-index-url https://download.pytorch.org/whl/cpu ."


def test_contributing_names_files_a_clone_has_and_a_chapter_that_exists():
    text = (ROOT/"CONTRIBUTING.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)", text)
    paths = [p for p in re.findall(r"`([\w./-]+\.(?:md|ipynb|py|yml|yaml))`", text) if "/" in p or p.endswith(".md")]
    assert "STYLE.md" in links and links and paths
    for p in links + paths: assert (ROOT/p).exists(), f"CONTRIBUTING.md names {p}, which a clone does not have"
    chapters = re.findall(r"nbdev-test\s+([^\s`]+)", text)
    assert chapters, "CONTRIBUTING.md shows no one-chapter test command"
    for c in chapters: assert c.endswith(".ipynb") and (ROOT/c).is_file(), f"`nbdev-test {c}` tests nothing and exits 0: no such notebook"


def test_quarto_comment_says_which_outputs_the_notebooks_keep():
    comment = " ".join(l.lstrip("# ") for l in (ROOT/"nbs"/"_quarto.yml").read_text().splitlines() if l.startswith("#"))
    assert "not committed" not in comment
    assert "tagged `results`" in comment and "saved_outputs.py" in comment, comment


def _install_section() -> str:
    cells = json.loads((ROOT/"nbs"/"index.ipynb").read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown" and "## Install" in "".join(c["source"]))
    return re.search(r"^## Install\n.*?(?=^## |\Z)", text, re.M | re.S).group(0)


def test_install_section_puts_the_cpu_wheels_first_with_the_size_of_each_path():
    section = _install_section()
    commands = [l for l in section.splitlines() if l.startswith("pip install")]
    assert commands[0].startswith(CPU_INSTALL), commands   # a CPU machine's path first
    sizes = re.findall(r"about [\d.,]+ ([MG]B)", section)
    assert "MB" in sizes and "GB" in sizes, sizes   # the CPU path in megabytes, PyPI's CUDA torch in gigabytes
    assert section in (ROOT/"README.md").read_text().replace("\r", ""), "README.md's Install differs from the home page's: make readme"


def test_every_install_instruction_says_it_the_same_way():
    sys.path.insert(0, str(ROOT/"tools"))
    import preview, dml_book.results as r
    assert CPU_INSTALL in r.INSTALL and "`pip install .`" in r.INSTALL
    for f in ("experiments_dir", "results_dir"):   # the messages that tell a user to reinstall quote it
        assert "{INSTALL}" in __import__("inspect").getsource(getattr(r, f)), f
    html = preview.install_section()
    assert CPU_INSTALL in html and html.count("<pre>") == _install_section().count("```sh"), html
    said = [p for p in [ROOT/"README.md", ROOT/"CONTRIBUTING.md", ROOT/"setup.py", *(ROOT/"tools").glob("*.py"), *(ROOT/"dml_book").rglob("*.py"),
                        *(ROOT/"nbs").rglob("*.ipynb")]
            if "_preview" not in p.parts and "pip install dml_book" in p.read_text()]
    assert not said, f"`pip install dml_book` does not work yet (not on PyPI), yet these say it: {said}"


def test_no_study_page_calls_a_gpus_time_cpu_minutes():
    "Each stored study's time line names what was measured: wall-clock minutes, or CPU-minutes only for runs on the CPU."
    from dml_book.study import study_facts, time_text, where_text
    studies = sorted(p.parent for p in (ROOT/"results").rglob("study.json"))
    assert studies
    for folder in studies:
        facts = study_facts(folder)
        line = f"{time_text(facts)} on {where_text(facts)}"
        if "NVIDIA" in where_text(facts): assert "CPU-minutes" not in line, (folder, line)
    pages = [ROOT/"nbs"/"what_we_found.ipynb", *(ROOT/"nbs").glob("2*_methods.*.ipynb"), *(ROOT/"nbs"/"experiments").glob("*.ipynb")]
    for nb in pages:
        shown = json.dumps([c.get("outputs", []) for c in json.loads(nb.read_text())["cells"]])
        assert not re.search(r"CPU-minutes on [^\"]*NVIDIA", shown), f"{nb.name} says CPU-minutes of a GPU's runs: make readme"
