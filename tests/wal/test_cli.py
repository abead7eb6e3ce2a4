"""``raftkv wal dump|verify|repair``, run through kvserver.cli.main like the console script."""

import json
import os

import wal
from kvserver.cli import main
from raftpb import HardState
from wal.dump import DumpRecord, dump

from .helpers import entries


def small_wal(path):
    w = wal.create(path, b"cli", segment_size_bytes=2048, prepare_ahead=False)
    for i in range(1, 30, 3):
        w.save(HardState(term=1, vote=1, commit=i - 1), entries(i, i + 2, size=50))
    w.close()
    return sorted(n for n in os.listdir(path) if n.endswith(".wal"))


def test_dump_prints_every_record_as_a_table_and_as_json(ram_path, capsys):
    path = f"{ram_path}/wal"
    names = small_wal(path)
    assert len(names) > 1
    assert main(["wal", "dump", path]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["SEGMENT", "OFFSET", "TYPE", "INDEX"]
    n_records = len([r for r in dump(path) if isinstance(r, DumpRecord)])
    assert len(table) == 1 + n_records
    assert any(" entry " in row and " yes " in row for row in table)

    assert main(["wal", "dump", "--json", path]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == n_records and all(r["crc_ok"] for r in rows)
    ents = [r for r in rows if r["type"] == "entry"]
    assert [r["index"] for r in ents] == list(range(1, 31))
    assert {r["segment"] for r in rows} == set(names)
    assert rows[0] == {
        "segment": names[0],
        "offset": 0,
        "type": "crc",
        "crc": 0,
        "crc_ok": True,
        "record_bytes": 4,
        "data_bytes": None,
        "frame_bytes": 16,
    }


def test_verify_and_repair_a_torn_tail(ram_path, capsys):
    path = f"{ram_path}/wal"
    names = small_wal(path)
    assert main(["wal", "verify", path]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    last = os.path.join(path, names[-1])
    recs = [r for r in dump(path) if isinstance(r, DumpRecord) and r.segment == names[-1]]
    cut = recs[-1].offset + 11
    with open(last, "r+b") as f:
        f.truncate(cut)
    assert main(["wal", "verify", path]) == 1
    err = capsys.readouterr().err
    assert f"torn write: {last} at offset {recs[-1].offset}" in err and "wal repair" in err
    assert main(["wal", "repair", path]) == 0
    capsys.readouterr()
    assert os.path.getsize(last) == recs[-1].offset and os.path.exists(last + ".broken")
    assert main(["wal", "verify", path]) == 0


def flip_entry(path, segment, nth=0):
    rec = [
        r
        for r in dump(path)
        if isinstance(r, DumpRecord) and r.segment == segment and r.type == "entry"
    ][nth]
    victim = os.path.join(path, segment)
    data = bytearray(open(victim, "rb").read())
    data[rec.offset + 30] ^= 0x04
    open(victim, "wb").write(bytes(data))
    return victim, rec.offset


def test_verify_reports_mid_log_corruption_and_repair_does_not_hide_it(ram_path, capsys):
    path = f"{ram_path}/wal"
    names = small_wal(path)
    victim, offset = flip_entry(path, names[0], nth=1)
    before = {n: open(os.path.join(path, n), "rb").read() for n in names}
    assert main(["wal", "verify", path]) == 1
    assert f"corrupt: {victim} at offset {offset}: crc mismatch" in capsys.readouterr().err
    assert main(["wal", "dump", path]) == 1  # lists everything, flags the bad record
    assert " NO " in capsys.readouterr().out
    assert main(["wal", "repair", path]) == 1  # tail is fine, the log is not: exit 1
    assert f"{victim} at offset {offset}" in capsys.readouterr().err
    assert {n: open(os.path.join(path, n), "rb").read() for n in names} == before


def test_repair_refuses_damage_in_the_last_segment_that_is_not_torn(ram_path, capsys):
    path = f"{ram_path}/wal"
    names = small_wal(path)
    victim, offset = flip_entry(path, names[-1])
    before = open(victim, "rb").read()
    assert main(["wal", "repair", path]) == 1
    err = capsys.readouterr().err
    assert "not repairable" in err and f"corrupt: {victim} at offset {offset}" in err
    assert open(victim, "rb").read() == before and not os.path.exists(victim + ".broken")


def test_errors_are_reported_not_raised(ram_path, capsys):
    for command in ("dump", "verify", "repair"):
        assert main(["wal", command, f"{ram_path}/nothing"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err == f"error: {ram_path}/nothing: not a directory\n"


def test_a_directory_without_a_wal_is_refused_alike_by_every_command(ram_path, capsys):
    empty = f"{ram_path}/empty"
    os.makedirs(f"{empty}/member/wal")  # the layout, but no segment in it
    for command in ("dump", "verify", "repair"):
        assert main(["wal", command, empty]) == 1
        out, err = capsys.readouterr()
        assert out == ""  # not even the dump's header
        assert err == (
            f"error: {empty}: no WAL segment here, nor in {empty}/member/wal or {empty}/wal\n"
        )


def test_a_data_dir_or_member_dir_finds_its_member_wal(ram_path, capsys):
    data_dir = f"{ram_path}/node1"
    wal_dir = f"{data_dir}/member/wal"
    small_wal(wal_dir)
    assert main(["wal", "dump", "--json", wal_dir]) == 0
    expected = capsys.readouterr().out
    for given in (data_dir, f"{data_dir}/member"):
        assert main(["wal", "dump", "--json", given]) == 0
        out, err = capsys.readouterr()
        assert out == expected and err == f"WAL directory: {wal_dir}\n"
        assert main(["wal", "verify", given]) == 0
        out, err = capsys.readouterr()
        assert "last entry index 30" in out and err == f"WAL directory: {wal_dir}\n"
    names = sorted(n for n in os.listdir(wal_dir) if n.endswith(".wal"))
    last = os.path.join(wal_dir, names[-1])
    recs = [r for r in dump(wal_dir) if isinstance(r, DumpRecord) and r.segment == names[-1]]
    with open(last, "r+b") as f:
        f.truncate(recs[-1].offset + 11)  # a torn tail
    assert main(["wal", "verify", data_dir]) == 1
    assert f"run: raftkv wal repair {data_dir}" in capsys.readouterr().err
    assert main(["wal", "repair", data_dir]) == 0
    assert os.path.exists(last + ".broken")
    assert main(["wal", "verify", data_dir]) == 0
