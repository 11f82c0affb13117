"""gdrpy/tools/ucx_protoinfo.py: the summaries scripts/ucx_perftest.sh prints of UCX's
protocol selection (no UCX or GPU needed: inputs in UCX 1.22's formats)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gdrpy.tools import ucx_protoinfo


def _node(nid: int, name: str, desc: str = "", lit: bool = False) -> str:
    fill = 'fillcolor="#FFE0E0" style="filled" ' if lit else 'style="" '
    d = f'<font face="calibri" point-size="11">{desc}<br/></font>' if desc else ""
    return (f'\tnode{nid} [shape=note {fill}label=<<b>{name}</b><br align="center"/>'
            f'{d}<font face="calibri" point-size="13">lat 0.4&mu;s</font>>];')


def _graph(copy_tl: str, proto: str = "egr/single/bcopy", rng: str = "1..1197") -> str:
    """A UCX_PROTO_INFO_DIR graph: selected copy-in/copy-out protocol whose copies go
    through COPY_TL, plus a not-selected zero-copy alternative."""
    return "\n".join([
        "digraph {",
        '\tnode0 [label="eager copy-in copy-out\\nsysv/memory" shape=box style=rounded]',
        "\tnode0 -> node1 [style=bold];",
        (f'\tnode1 [shape=oval fillcolor="#FFE0E0" style="filled" label=<<b>selected</b>'
         f'<br align="center"/><font face="calibri" point-size="11">{proto} {rng}<br/>'
         "</font>>];"),
        "\tnode1 -> node2 [style=bold];",
        _node(2, proto, "flat perf", lit=True),
        "\tnode2 -> node3 [style=bold];",
        _node(3, "am_bcopy", "sysv/memory", lit=True),
        "\tnode2 -> node4 [style=bold];",
        _node(4, "local copy", "cuda to host", lit=True),
        "\tnode4 -> node9 [style=bold];",
        _node(9, "mem reg", lit=True),  # registration cost: not a transport
        "\tnode4 -> node5 [style=bold];",
        _node(5, "get_short", copy_tl, lit=True),
        "\tnode2 -> node6 [style=bold];",
        _node(6, "remote copy", "host to cuda", lit=True),
        "\tnode6 -> node7 [style=bold];",
        _node(7, "put_short", copy_tl, lit=True),
        "\tnode1 -> node8 [style=dotted];",
        _node(8, "put_zcopy", "cuda_ipc/cuda"),
        "}",
    ])


@pytest.mark.parametrize("tl", ["gdr_copy/cuda", "cuda_copy/cuda"])
def test_graph_names_copy_transport(tmp_path: Path, tl: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    name = "perftest_intra_node_cfg_2_tag_send_from_cuda_GPU0_1_1197.dot"
    (tmp_path / name).write_text(_graph(tl))
    assert ucx_protoinfo.main(["dot", str(tmp_path), "--sizes", "8,1024,8192"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    line = out[0]
    assert line.startswith("intra_node_cfg_2_tag_send_from_cuda_GPU0 [size 8,1024]:"), line
    assert "egr/single/bcopy 1..1197" in line
    assert "lane am_bcopy sysv/memory" in line
    assert f"local copy cuda to host via get_short {tl}" in line
    assert f"remote copy host to cuda via put_short {tl}" in line
    assert "cuda_ipc" not in line  # not the selected protocol


def test_graph_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "perftest_self_cfg_3_get_into_host_memory_from_cuda_dev_0_1_92.dot").write_text(
        _graph("gdr_copy/cuda", "get/am/bcopy", "1..92"))
    (tmp_path / "perftest_self_cfg_3_put_fast_completion_from_cuda_GPU0_1_92.dot").write_text(
        _graph("gdr_copy/cuda", "put/am/bcopy", "1..92"))
    # size outside every range: nothing
    ucx_protoinfo.main(["dot", str(tmp_path), "--sizes", "4096"])
    assert "no protocol graphs" in capsys.readouterr().out
    # the fast-completion flavour is skipped unless asked for
    ucx_protoinfo.main(["dot", str(tmp_path), "--sizes", "8"])
    out = capsys.readouterr().out
    assert "get/am/bcopy" in out and "put/am/bcopy" not in out
    ucx_protoinfo.main(["dot", str(tmp_path), "--sizes", "8", "--all-flavours"])
    assert "put/am/bcopy" in capsys.readouterr().out


def test_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = "[1795448798.134868] [vm:2943 :0]   "
    q = "[1795448798.135000] [vm:2943 :0]   "
    log = tmp_path / "client.log"
    log.write_text("\n".join([
        "some other line",
        p + "+--------+-------------+------------------+",
        p + "| perftest intra-node cfg#2                |",
        p + "| remote memory write by ucp_put* from cuda/GPU0 to cuda/dev[0] |",
        p + "+--------+-------------+------------------+",
        p + "| Range  | Description |      Config      |",
        p + "+--------+-------------+------------------+",
        p + "| 0..inf | zero-copy   | cuda_ipc/cuda    |",
        p + "+--------+-------------+------------------+",
        q + "| perftest intra-node cfg#0                |",
        q + "| tagged message by ucp_tag_send* from host memory |",
        q + "| Range  | Description |      Config      |",
        q + "| 0..92  | eager short | sysv/memory      |",
        "Final: 1 2 3",
    ]) + "\n")
    assert ucx_protoinfo.main(["tables", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("perftest intra-node cfg#2 | remote memory write by ucp_put* "
                      "from cuda/GPU0 to cuda/dev[0]")
    assert out[1].split() == ["0..inf", "zero-copy", "cuda_ipc/cuda"]
    assert len(out) == 2  # the host-memory table is not about cuda


def test_parse_range() -> None:
    assert ucx_protoinfo.parse_range("egr/multi/bcopy 8249..262143") == (8249, 262143)
    assert ucx_protoinfo.parse_range("tag/rndv 256K..inf") == (256 << 10, sys.maxsize)
    assert ucx_protoinfo.parse_range("no range") is None
