"""Atomic writes: a writer killed outright mid-write leaves its temporary, which the next write into
that folder removes; a live writer's temporary is left alone."""

import os
import signal
import subprocess
import sys

from autoshard.core.atomic import WRITER, atomic_dir, atomic_file

WRITE_FOREVER = """
import sys, time
from autoshard.core.atomic import atomic_file
with atomic_file(sys.argv[1]) as tmp:
    tmp.write_text("half")
    print("writing", flush=True)
    time.sleep(600)
"""


def temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if WRITER.search(p.name))


def writer(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITE_FOREVER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "writing\n"
    return proc


def test_a_killed_writers_temporary_is_removed_by_the_next_write_and_a_live_ones_kept(tmp_path):
    killed, live = writer(tmp_path / "a.json"), writer(tmp_path / "b.json")
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert len(temporaries(tmp_path)) == 2 and not (tmp_path / "a.json").exists()
        with atomic_file(tmp_path / "c.json") as tmp:
            tmp.write_text("whole")
        left = temporaries(tmp_path)
        assert left == [n for n in left if n.startswith(".b.json.")] and len(left) == 1, "the live writer's stays"
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "x").write_text("whole")
        assert len(temporaries(tmp_path)) == 1 and (tmp_path / "d" / "x").read_text() == "whole"
    finally:
        live.kill()
        live.wait()
    with atomic_file(tmp_path / "a.json") as tmp:
        tmp.write_text("whole")
    assert temporaries(tmp_path) == [] and (tmp_path / "a.json").read_text() == "whole"
    assert (tmp_path / "c.json").read_text() == "whole"


def test_a_failed_block_leaves_the_previous_output(tmp_path):
    (tmp_path / "a.json").write_text("before")
    try:
        with atomic_file(tmp_path / "a.json") as tmp:
            tmp.write_text("half")
            raise RuntimeError
    except RuntimeError:
        pass
    assert (tmp_path / "a.json").read_text() == "before" and temporaries(tmp_path) == []


def test_first_wins_keeps_a_file_another_writer_finished_first(tmp_path):
    with atomic_file(tmp_path / "a.json", first_wins=True) as mine:
        mine.write_text("mine")
        with atomic_file(tmp_path / "a.json", first_wins=True) as theirs:
            theirs.write_text("theirs")
    assert (tmp_path / "a.json").read_text() == "theirs" and temporaries(tmp_path) == []
    with atomic_file(tmp_path / "a.json") as tmp:
        tmp.write_text("replaced")
    assert (tmp_path / "a.json").read_text() == "replaced", "without first_wins the last write wins"
