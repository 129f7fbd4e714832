"""The documentation (issue 24 item 9): README.md is a short front page, docs/ the reference,
and both build into a site with mkdocs under --strict (broken links and anchors, and pages
missing from the nav, fail). Every `encoder-eval` command and flag, `python -m encoder_eval`
module, `run_all.sh` flag and `make` target the pages show in code must exist, every
repository path they name must exist, and the cheap examples (`--version`, `list`) are run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from encoder_eval.cli import COMMANDS
from encoder_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
# The pages whose code is checked: the front page, the reference and the agents' page.
PAGES = [README, *DOCS, REPO / "AGENTS.md"]
# Every page of the site, for the repository paths they name.
SITE_PAGES = [*PAGES, REPO / "EVALUATION_METHODOLOGY.md", REPO / "SECURITY.md"]
README_MAX_LINES = 260
SHELL = {"bash", "sh", "shell", "console"}
# The probe command switches to NeuCo-Bench's parser when one of these is given.
PROBE_MODE_FLAGS = ("--annotation-path", "--annotation_path", "--submission-file",
                    "--submission_file")  # fmt: skip


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a markdown text, as (language, body)."""
    return re.findall(r"^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def inline_commands(text: str) -> list[str]:
    """Inline code spans that are an `encoder-eval` or `python -m encoder_eval` command line."""
    spans = re.findall(r"(?<!`)`([^`]+)`(?!`)", text)
    return [" ".join(s.split()) for s in spans
            if re.match(r"(encoder-eval|python -m encoder_eval)\s", s)]  # fmt: skip


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script, each as its tokens (comments dropped; `&&`,
    `;`, `|` and parentheses separate commands)."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        cmd: list[str] = []
        for tok in [*tokens, ";"]:
            if set(tok) <= set("();&|<>"):
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(tok)
    return out


def strip_env(tokens: list[str]) -> list[str]:
    """A command without its leading `VAR=value` assignments."""
    while tokens and re.match(r"[A-Za-z_]\w*=", tokens[0]):
        tokens = tokens[1:]
    return tokens


def flags_of(args: list[str]) -> list[str]:
    """The long flags among a command's arguments (`[--x` as in a usage line counts)."""
    out = []
    for a in args:
        a = a.lstrip("[")
        m = re.fullmatch(r"(--[A-Za-z][\w-]*)(=.*)?\]?", a)
        if m:
            out.append(m.group(1))
    return out


def leading_words(args: list[str]) -> list[str]:
    """The subcommand words before the first flag (`track run`, `list tasks`)."""
    out = []
    for a in args:
        if not re.fullmatch(r"[a-z][a-z_-]*", a):
            break
        out.append(a)
    return out


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`encoder-eval ARGV` in this process: its exit status and stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            rc = cli_main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return int(rc or 0), buf.getvalue()


def help_flags(help_text: str) -> set[str]:
    """The flags an argparse help text shows: in its usage, and each option's invocation."""
    usage, _, rest = help_text.partition("\n\n")
    found = set(re.findall(r"(--[A-Za-z][\w-]*)", usage))
    for line in rest.splitlines():
        if line.lstrip().startswith("-"):
            invocation = re.split(r"\s{2,}", line.strip())[0]
            found |= set(re.findall(r"(--[A-Za-z][\w-]*)", invocation))
    return found


@cache
def accepted_flags(help_argv: tuple[str, ...]) -> set[str]:
    """The flags of the command that `encoder-eval HELP_ARGV` prints the help of."""
    rc, out = run_cli(list(help_argv))
    assert rc == 0 and "usage:" in out, f"`encoder-eval {' '.join(help_argv)}` gave {rc}: {out}"
    return help_flags(out)


@cache
def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M))


@cache
def run_all_flags() -> set[str]:
    (template,) = REPO.glob("encoder_eval/**/templates/run_all.sh")
    return set(re.findall(r"(--[A-Za-z][\w-]*)(?:=\*)?\s*[|)]", template.read_text()))


def check_cli(args: list[str], where: str) -> list[str]:
    """Problems with `encoder-eval ARGS` as a page shows it: an unknown command, or a flag
    that command's parser does not take."""
    args = [a for a in (a.strip("[]") if a in ("[", "]") else a for a in args) if a]
    if not args or args[0] in ("--version", "-V", "--help", "-h") or args[0].startswith("<"):
        return []
    name = args[0]
    if name not in COMMANDS:
        return [f"{where}: `encoder-eval {name}` is not a command ({', '.join(COMMANDS)})"]
    words = leading_words(args[1:])
    flags = flags_of(args[1:])
    mode = tuple(f for f in flags if f in PROBE_MODE_FLAGS)[:1]
    known = accepted_flags((name, *words, "--help", *mode))
    return [f"{where}: `encoder-eval {' '.join([name, *words])}` takes no {f}"
            for f in flags if f not in known]  # fmt: skip


def check_command(tokens: list[str], where: str) -> list[str]:
    """Problems with one shell command of a page (ignored unless it is ours)."""
    tokens = strip_env(tokens)
    if not tokens:
        return []
    prog = Path(tokens[0]).name
    if prog == "encoder-eval":
        return check_cli(tokens[1:], where)
    if re.fullmatch(r"python3?(\.\d+)?", prog) and tokens[1:2] == ["-m"] and len(tokens) > 2:
        module, rest = tokens[2], tokens[3:]
        if module == "encoder_eval":
            return check_cli(rest, where)
        if not module.startswith("encoder_eval."):
            return []
        if importlib.util.find_spec(module) is None:
            return [f"{where}: `python -m {module}`: no such module"]
        name = module.rsplit(".", 1)[1]
        return check_cli([name, *rest], where) if name in COMMANDS else []
    if prog == "make":
        targets = [t for t in tokens[1:] if not t.startswith("-") and "=" not in t]
        return [f"{where}: `make {t}`: no such target in the Makefile"
                for t in targets if t not in make_targets()]  # fmt: skip
    script = tokens[1] if prog == "bash" and len(tokens) > 1 else tokens[0]
    if Path(script).name == "run_all.sh":
        rest = tokens[2:] if prog == "bash" else tokens[1:]
        return [f"{where}: run_all.sh takes no {f}"
                for f in flags_of(rest) if f not in run_all_flags()]  # fmt: skip
    return []


def page_problems(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    problems = []
    for lang, body in code_blocks(text):
        if lang in SHELL:
            for tokens in shell_commands(body):
                problems += check_command(tokens, _rel(page))
    for line in inline_commands(text):
        problems += check_command(shlex.split(line), f"{_rel(page)} (inline)")
    return problems


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    text = "\n".join(lines)
    for heading in ("## Install and test first", "## The demo", "## One cell",
                    "## The two-phase protocol", "## Where to read on"):  # fmt: skip
        assert f"\n{heading}" in text, heading
    # The test command CI runs (.ci/run) and the demo are shown as commands.
    blocks = [b for lang, b in code_blocks(text) if lang in SHELL]
    shown = [strip_env(c) for b in blocks for c in shell_commands(b)]
    for cmd in (["make", "install"], ["make", "test"], ["make", "demo"]):
        assert cmd in shown, cmd
    # Every page of the reference is reachable from the front page.
    for page in DOCS:
        assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def test_the_docs_build_strictly(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert "Where to read on" in (site / "index.html").read_text(encoding="utf-8")
    for page in [*(p.stem for p in DOCS), "EVALUATION_METHODOLOGY", "AGENTS", "SECURITY"]:
        assert (site / page / "index.html").is_file(), page
    assert (site / "images" / "track_glue_stsb.png").is_file()


@pytest.mark.parametrize(
    "breakage",
    [("cells.md", "[x](no-such-page.md)"), ("cells.md", "[x](../README.md#no-such-heading)"),
     ("orphan.md", "# A page missing from the nav")],
    ids=["link", "anchor", "nav"],
)  # fmt: skip
def test_the_strict_build_fails_on_a_broken_page(tmp_path, breakage):
    """The build the test above runs would catch each breakage (the config is strict)."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "README.md", "EVALUATION_METHODOLOGY.md", "AGENTS.md",
                 "SECURITY.md"):  # fmt: skip
        shutil.copy(REPO / name, copy / name)
    page, line = breakage
    with open(copy / "docs" / page, "a", encoding="utf-8") as f:
        f.write(f"\n{line}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=copy, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Aborted" in out and page in out, out


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_command_and_flag_shown_exists(page):
    assert page_problems(page) == []


def test_the_checker_finds_a_wrong_command_flag_and_target():
    """What test_every_command_and_flag_shown_exists would say of broken examples."""
    script = (
        "encoder-eval sweep --phase select --out-dirr runs/select\n"
        "encoder-eval runn --task x\n"
        "HF_HUB_OFFLINE=1 .venv/bin/python -m encoder_eval.run --model-keyy m \\\n  --seed 45\n"
        "encoder-eval track run --checkpoints c.tsv --kind probe --treshold 0.1\n"
        "encoder-eval probe --annotation-path l/ --submission-file e.csv --tasks all\n"
        "make tests\n"
        "bash runs/select/run_all.sh --worker 4\n"
        "encoder-eval list tasks --format json && make demo DATA_DIR=x  # fine\n"
    )
    problems = [p for c in shell_commands(script) for p in check_command(c, "page")]
    assert problems == [
        "page: `encoder-eval sweep` takes no --out-dirr",
        "page: `encoder-eval runn` is not a command (" + ", ".join(COMMANDS) + ")",
        "page: `encoder-eval run` takes no --model-keyy",
        "page: `encoder-eval track run` takes no --treshold",
        "page: `encoder-eval probe` takes no --tasks",
        "page: `make tests`: no such target in the Makefile",
        "page: run_all.sh takes no --worker",
    ]


def test_the_cheap_examples_run():
    """`encoder-eval --version` prints what the page says; every `encoder-eval list` shown runs."""
    ran = []
    for page in PAGES:
        for lang, body in code_blocks(page.read_text(encoding="utf-8")):
            if lang not in SHELL:
                continue
            for line in body.splitlines():
                m = re.fullmatch(r"encoder-eval (--version|list [a-z]+)\s*(?:#\s*(.*))?", line)
                if not m:
                    continue
                rc, out = run_cli(m.group(1).split())
                assert rc == 0 and out.strip(), (line, rc, out)
                if m.group(1) == "--version" and m.group(2):
                    assert out.strip() == m.group(2).strip(), (line, out)
                ran.append(m.group(1))
    assert {"--version", "list tasks", "list models", "list groups", "list grid"} <= set(ran)


# Paths a page names that are not in the repository, each with why; an entry leaves this list
# when the file arrives (the test says so).
KNOWN_MISSING: set[str] = set()  # paths the docs name before they exist (none now)


def test_every_repository_path_named_exists():
    """A path in code (`examples/x.py`, `tests/test_x.py::test_y`) names a real file (and
    test)."""
    problems = []
    for page in SITE_PAGES:
        text = page.read_text(encoding="utf-8")
        for path in re.findall(
            r"`((?:encoder_eval|examples|bench|tests|docs|\.ci)/[^`\s]*)`", text
        ):
            if re.search(r"[<>{}]", path) or path in KNOWN_MISSING:
                continue
            path, _, test = path.partition("::")
            matches = list(REPO.glob(path.rstrip("/"))) if "*" in path else [REPO / path]
            if not any(m.exists() for m in matches):
                problems.append(f"{_rel(page)}: `{path}` does not exist")
            elif test and not re.search(rf"^def {re.escape(test)}\(", matches[0].read_text(), re.M):
                problems.append(f"{_rel(page)}: `{path}` has no {test}")
    assert problems == []
    assert [p for p in KNOWN_MISSING if (REPO / p).exists()] == []


def test_the_optimism_table_is_the_kept_values():
    """EVALUATION_METHODOLOGY section 6's rerun table: every difference it prints is what
    `bench/holdout_optimism.py --from-json` computes from the per-seed values kept in
    `bench/results/holdout_optimism.json` (issue 28 item 8)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "holdout_optimism.py"), "--from-json",
         str(REPO / "bench" / "results" / "holdout_optimism.json")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    page = (REPO / "EVALUATION_METHODOLOGY.md").read_text(encoding="utf-8").replace("−", "-")
    rows = [line for line in out.splitlines() if line.startswith("| glue_") or
            line.startswith("| sg_")]  # fmt: skip
    assert len(rows) == 4, out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        # default, last evaluation, strict, and the three differences with their intervals
        for value in cells[2:8]:
            assert value in page, f"{cells[0]}: {value} is not in the methodology's table"


# ----------------------------------------------------------------- issue 40 item 18


def _headings(path: Path) -> set[str]:
    """A page's headings, without their `#`s and section numbers (`10. `)."""
    return {
        re.sub(r"^\d+\.\s+", "", line.lstrip("#").strip())
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


# A pointer in code or a message: `(README, 'Section')`, `docs/tasks.md, "Section"`.
POINTER = re.compile(r"""(README|docs/[\w-]+\.md|[A-Z_]+\.md),\s*['"]([^'"]+)['"]""")


def _texts(path: Path) -> list[str]:
    """The strings (implicit concatenations joined) and comments of a Python file."""
    import ast
    import tokenize

    source = path.read_text(encoding="utf-8")
    texts = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)]
    with path.open("rb") as handle:
        texts += [
            t.string for t in tokenize.tokenize(handle.readline) if t.type == tokenize.COMMENT
        ]
    return [t for t in texts if isinstance(t, str)]


def test_every_section_the_code_points_to_exists():
    """A message, help text or comment that sends the user to a page's section names one
    that exists (an unknown task pointed to a README section "Adding a task" that was not
    there: it is docs/tasks.md's)."""
    found, missing = 0, []
    for path in sorted((REPO / "encoder_eval").rglob("*.py")):
        for text in _texts(path):
            for page, section in POINTER.findall(" ".join(text.split())):
                target = REPO / ("README.md" if page == "README" else page)
                found += 1
                section = re.sub(r"^\d+\.\s+", "", section)  # "12. Probing"
                if not target.is_file() or section not in _headings(target):
                    missing.append(f"{_rel(path)}: {page}, {section!r}")
    assert found >= 3  # the task hint, the --tasks-file help, the exit codes, ...
    assert not missing, missing


def test_the_readme_lists_every_command():
    """The README's sentence of commands names every `encoder-eval` command."""
    text = README.read_text(encoding="utf-8")
    sentence = text[text.index("`encoder-eval <command>` runs one step") :]
    sentence = sentence[: sentence.index("(`encoder-eval --help`")]
    named = set(re.findall(r"`([a-z-]+)`", sentence))
    assert set(COMMANDS) <= named, sorted(set(COMMANDS) - named)


def test_the_readme_says_what_make_install_installs():
    """The README's `make install` line names the extras the Makefile installs by default."""
    extras = re.search(r"^EXTRAS \?= (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    line = next(ln for ln in README.read_text().splitlines() if ln.startswith("make install "))
    assert f'".[{extras}]"' in line, (extras, line)


def test_the_readme_points_a_new_user_to_the_quick_tests_first():
    """Issue 50: `make test` was the second command of the install block and nothing said
    it takes 15+ minutes on two cores; `make test-fast` comes first, `make test` says so."""
    lines = README.read_text(encoding="utf-8").splitlines()
    fast = next(i for i, ln in enumerate(lines) if ln.startswith("make test-fast "))
    full = next(i for i, ln in enumerate(lines) if ln.startswith("make test "))
    assert fast < full and "minutes" in lines[full]
    assert lines.index(next(ln for ln in lines if ln.startswith("make install "))) < fast


def test_what_the_readmes_commands_write_git_ignores():
    """Issue 50: the README's smoke block wrote `smoke-selection.json` into the repository
    root, where git saw it. Every output a README command names is ignored."""
    outputs = ("--out", "--out-json", "--results-dir", "--out-dir", "--plots", "--plot")
    named = []
    for _, body in code_blocks(README.read_text(encoding="utf-8")):
        for cmd in map(strip_env, shell_commands(body)):
            if cmd and cmd[0] == "encoder-eval":
                named += [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a in outputs]
    assert "selection-smoke.json" in named and "report.html" in named
    seen = [p for p in named if not p.startswith(("/", "$", "<", "~", "."))]
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching",
                           *seen], cwd=REPO, capture_output=True, text=True)  # fmt: skip
    shown = [ln.split("\t")[-1] for ln in proc.stdout.splitlines() if ln.startswith("::")]
    assert shown == [], f"README commands write where git does not ignore: {shown}"


def test_the_readme_demo_table_has_the_header_and_footnotes_summarize_prints(tmp_path, capsys):
    """The demo's table in the README has the header, the cell format (mean ± std
    [interval]) and the footnote lines `summarize` prints for the demo's tasks and seeds
    (the scores themselves are a measurement)."""
    sys.path.insert(0, str(REPO / "tests"))
    from result_helpers import make_result, make_selection, write_many

    from encoder_eval import demo, summarize

    tasks = demo.DEMO_TASKS.split(",")
    model = demo.DEMO_MODEL_KEY
    seeds = [int(s) for s in demo.build_parser().get_default("report_seeds").split(",")]
    sel = tmp_path / "selection.json"
    sel.write_text(__import__("json").dumps(make_selection(dict.fromkeys(
        [(model, t) for t in tasks], "lr10"))))  # fmt: skip
    results = [make_result(model, t, "lr10", s, "report", 0.5 + 0.01 * s - 0.4)
               for t in tasks for s in seeds]  # fmt: skip
    write_many(tmp_path / "r", results)
    assert summarize.main(["--results-dir", str(tmp_path / "r"), "--selection", str(sel),
                           "--allow-partial"]) == 0  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    readme = README.read_text(encoding="utf-8")
    block = readme[readme.index("The table of the run measured in") :]
    block = block[block.index("```") + 3 : block.index("```", block.index("```") + 3)]
    shown = [ln for ln in block.strip().splitlines()]
    assert shown[:2] == printed[:2]  # the header and the alignment row
    row = shown[2]
    assert row.startswith(f"| {model} | ") and row.count("[") == len(tasks), row
    for line in shown[3:]:  # the footnotes the README quotes, as printed
        if line.strip():
            assert line in printed, line
