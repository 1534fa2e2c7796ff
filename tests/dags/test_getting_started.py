"""docs/getting-started.md, followed as a reader follows it.

The page marks each of its code blocks with an HTML comment (invisible on the built page):

* ``<!-- getting-started-test: run -->``: a bash block, run as it stands;
* ``<!-- getting-started-test: file PATH -->``: a file the reader saves as ``PATH`` (the prose
  before it names the same path); written with a quoted heredoc, ``$VARIABLES`` in ``PATH`` expand;
* ``<!-- getting-started-test: cleanup -->``: a bash block run last, after this test's own checks;
* ``<!-- getting-started-test: skip (reason) -->``: a block the test does not run (``make venv``:
  the test runs in the environment it built).

The blocks run in order in **one** bash session (``set -eo pipefail``: the first failing command
fails the test), in a temporary ``HOME``, with this environment's ``bin`` first on ``PATH`` (what
``source .venv/bin/activate`` does). The only change made to them: moto's port, 5000 on the page,
becomes a free port of 127.0.0.1. Before the cleanup block, the test reads every record of the
stream back from moto, and afterwards compares them with the Iceberg table the user's DAG wrote,
opened through the page's catalog connection under the connection's id (the catalog's name).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
BIN = Path(sys.executable).parent
PAGE_PORT = "5000"

MARKER = re.compile(r"^<!-- getting-started-test: (run|file|cleanup|skip)\b\s*(.*?)\s*-->$")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block of the page with its marker (``kind`` ``None`` when unmarked)."""

    line: int  # 1-based line of the opening fence
    language: str
    code: str
    kind: str | None
    argument: str
    prose: str  # the page's text between the previous block and this one


def page_blocks(text: str) -> list[Block]:
    """Every fenced code block of ``text``, in order, with the marker right before it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    prose_start = 0
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{PAGE.name}:{i + 1}: code block never closed"
        before = next((lines[j] for j in range(i - 1, prose_start - 1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before.strip())
        blocks.append(Block(line=i + 1, language=fence.group(1), code="\n".join(lines[i + 1 : end]),
                            kind=marker.group(1) if marker else None, argument=marker.group(2) if marker else "",
                            prose="\n".join(lines[prose_start:i])))  # fmt: skip
        prose_start = i = end + 1
    return blocks


def page_script(blocks: list[Block], port: int, checks: str) -> str:
    """One bash script of the page's blocks, with moto on ``port``; ``checks`` before the cleanup."""
    parts = ["set -eo pipefail"]
    for block in blocks:
        if block.kind in (None, "skip"):
            continue
        if block.kind == "cleanup" and checks:
            parts.append(checks)
            checks = ""
        parts.append(f'echo "### {PAGE.name} line {block.line} ({block.kind})" >&2')
        if block.kind == "file":
            parts.append(f"cat > \"{block.argument}\" <<'GETTING_STARTED_EOF'\n{block.code}\nGETTING_STARTED_EOF")
        else:
            parts.append(block.code)
    if checks:
        parts.append(checks)
    script = "\n".join(parts) + "\n"
    script = script.replace(f"127.0.0.1 -p {PAGE_PORT}", f"127.0.0.1 -p {port}").replace(f"127.0.0.1:{PAGE_PORT}", f"127.0.0.1:{port}")
    assert PAGE_PORT not in script, f"port {PAGE_PORT} left in the page's commands after replacing moto's address"
    return script


# Run by the page's shell before its cleanup block (moto still up): every record of the stream,
# read from moto with the page's own aws connection, and the shell's working directory and
# environment, into $GETTING_STARTED_STATE.
CHECKS = """\
"$GETTING_STARTED_PYTHON" - <<'GETTING_STARTED_EOF'
import base64, json, os
import boto3
aws = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
kinesis = boto3.client("kinesis", endpoint_url=aws["extra"]["endpoint_url"], region_name=aws["extra"]["region_name"],
                       aws_access_key_id=aws["login"], aws_secret_access_key=aws["password"])
records = []
for shard in kinesis.list_shards(StreamName="clicks")["Shards"]:
    iterator = kinesis.get_shard_iterator(StreamName="clicks", ShardId=shard["ShardId"],
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    while iterator:
        page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
        records += [[shard["ShardId"], r["SequenceNumber"], base64.b64encode(r["Data"]).decode()] for r in page["Records"]]
        if not page["Records"]:
            break  # moto never ends an open shard's iterator chain
        iterator = page.get("NextShardIterator")
with open(os.environ["GETTING_STARTED_STATE"], "w") as fh:
    json.dump({"cwd": os.getcwd(), "env": dict(os.environ), "records": records}, fh)
GETTING_STARTED_EOF
"""


def run_page(page: Path, tmp_path: Path, timeout: float = 780) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``page``'s marked blocks; return the finished process and the state the checks saved."""
    port = free_port()
    script = tmp_path / "getting_started.sh"
    script.write_text(page_script(page_blocks(page.read_text(encoding="utf-8")), port, CHECKS), encoding="utf-8")
    state = tmp_path / "state.json"
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AWS_", "PYSPARK_", "KINESIS_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(BIN.parent),
               GETTING_STARTED_PYTHON=sys.executable, GETTING_STARTED_STATE=str(state))  # fmt: skip
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        # The page's background moto (and anything else the script left) is in the script's process group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.returncode is None:
            proc.wait(10)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, json.loads(state.read_text()) if state.exists() else {}


def test_every_code_block_of_the_page_is_marked():
    blocks = page_blocks(PAGE.read_text(encoding="utf-8"))
    unmarked = [f"line {b.line} ({b.language})" for b in blocks if b.kind is None]
    assert unmarked == [], "mark each block: <!-- getting-started-test: run|file PATH|cleanup|skip (reason) -->"
    for block in blocks:
        if block.kind in ("run", "cleanup"):
            assert block.language == "bash", f"line {block.line}: a {block.kind} block is bash"
        if block.kind == "file":
            assert block.argument, f"line {block.line}: a file block names its path"
            assert f"`{block.argument}`" in block.prose, f"line {block.line}: the prose before it does not name `{block.argument}`"
        if block.kind == "skip":
            assert block.argument.startswith("("), f"line {block.line}: say why the test skips it"
    kinds = [b.kind for b in blocks]
    assert kinds.count("cleanup") == 1 and kinds[-1] == "cleanup"
    commands = "\n".join(b.code for b in blocks if b.kind == "run")
    for command in ("airflow db migrate", "moto_server -H 127.0.0.1", "airflow dags test "):
        assert command in commands
    assert any(b.kind == "file" and b.argument.startswith("$AIRFLOW_HOME/dags/") for b in blocks), "no DAG file"


def test_page_is_near_the_top_of_the_toctree():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    toctree = index.split("```{toctree}", 1)[1].split("```", 1)[0]
    entries = [line.strip() for line in toctree.splitlines() if line.strip() and not line.startswith(":")]
    assert "getting-started" in entries[:3]


def test_port_of_the_page_is_replaced_everywhere_or_the_script_is_refused():
    blocks = page_blocks(PAGE.read_text(encoding="utf-8"))
    script = page_script(blocks, 45678, CHECKS)
    assert "127.0.0.1:45678" in script and "-p 45678" in script
    odd = Block(line=1, language="bash", code="curl http://localhost:5000", kind="run", argument="", prose="")
    with pytest.raises(AssertionError, match="port 5000 left"):
        page_script([odd], 45678, "")


@pytest.mark.dags
@pytest.mark.slow
@pytest.mark.spark
def test_getting_started_page_runs_and_its_dag_writes_every_record(tmp_path):
    proc, state = run_page(PAGE, tmp_path)
    assert proc.returncode == 0, f"the page's commands failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    put = re.search(r"^put (\d+) records into the stream 'clicks'$", proc.stdout, re.M)
    assert put, proc.stdout[-3000:]
    records = {(shard, seq, base64.b64decode(data)) for shard, seq, data in state["records"]}
    assert len(records) == len(state["records"]) == int(put.group(1)) > 0
    assert {shard for shard, _, _ in records} == {"shardId-000000000000", "shardId-000000000001"}

    # The table, read without the page's read_back.py: through the catalog connection's extra,
    # under the connection's id, which the operator makes the catalog's name.
    from pyiceberg.catalog import load_catalog

    env = state["env"]
    catalog_conn = json.loads(env["AIRFLOW_CONN_LAKE_CATALOG"])
    assert catalog_conn["conn_type"] == "generic"
    table = load_catalog("lake_catalog", **catalog_conn["extra"]).load_table("web.clicks")
    rows = table.scan().to_arrow()
    written = list(zip(rows.column("shard_id").to_pylist(), rows.column("sequence_number").to_pylist(),
                       rows.column("data").to_pylist(), strict=True))  # fmt: skip
    assert sorted(written) == sorted(records)  # every record once, nothing else
    assert [s.summary.additional_properties.get("kinesis-spark.batch-id") for s in table.snapshots()] == ["1"]
    assert table.location().rstrip("/").endswith(f"{env['LAKE']}/web/clicks")

    # What the page says its own commands print.
    assert f"{len(records)} rows in web.clicks" in proc.stdout
    assert re.search(r"^snapshot \d+ batch 1$", proc.stdout, re.M)
    assert "shardId-000000000000" in proc.stdout and "shardId-000000000001" in proc.stdout  # kinesis-spark checkpoints
    assert state["cwd"] == str(tmp_path / "home" / "kinesis-tutorial")
    assert (Path(env["AIRFLOW_HOME"]) / "dags" / "clicks_to_lake.py").is_file()
