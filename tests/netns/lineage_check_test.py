"""netns_cluster.check_lineage finds what it is meant to find, on made-up event logs and
lineage files (no cluster, no namespaces): a read of an attempt that never completed, a read of
an output superseded before the reader was placed, outputs written by a sink attempt that is
not the last completed one or not the one the status records; and it accepts the legitimate
cases (a reader placed before the newer attempt completed; chained dispatch; versions moved on
by a job manager restart; completions a SIGKILLed job manager journaled but whose event lines
were lost, at a restart or at the end of a completed job's log).

usage: lineage_check_test.py [ignored arguments]"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402

EVENTS = """\
     0.000s submitted: 3 vertices, 2 channels
     0.000s a[0] version 1 placed on d1
     0.010s a[0] version 1 completed on d1 in 9.0 ms, 100 output bytes
     0.010s b[0] version 1 placed on d2
     0.500s a[0] version 2 placed on d3
     0.600s a[0] version 2 completed on d3 in 9.0 ms, 100 output bytes
     0.700s b[0] version 1 completed on d2 in 600.0 ms, 100 output bytes
     0.700s sink version 1 placed on d2
     0.800s sink version 1 completed on d2 in 10.0 ms, 100 output bytes
     0.900s b[0] version 2 placed on d2
     1.000s b[0] version 2 completed on d2 in 10.0 ms, 100 output bytes
     1.000s sink version 2 placed on d3 chained after b[0]
     1.100s sink version 2 completed on d3 in 10.0 ms, 100 output bytes
""".splitlines()


def lineage(sink_version, b_version, a_version_read_by_b):
    return "\n".join([f"S sink[0] v{sink_version}",
                      f"E b[0] v{b_version} p0 <- a[0] v{a_version_read_by_b}",
                      f"E sink[0] v{sink_version} p0 <- b[0] v{b_version}"]) + "\n"


def expect(problems, words, what):
    if words is None:
        if problems:
            raise nc.Failure(f"{what}: expected no problem, got {problems}")
    elif not any(words in p for p in problems):
        raise nc.Failure(f"{what}: expected a problem saying {words!r}, got {problems}")
    print(f"ok: {what}")


def main():
    # b v1 was placed before a v2 completed: reading a v1 is legitimate.
    expect(nc.check_lineage(lineage(2, 2, 2), EVENTS), None, "the final chain, all current")
    expect(nc.check_lineage(lineage(1, 1, 1), EVENTS), "last completed version is 2", "outputs of a superseded sink")
    expect(nc.check_lineage(lineage(2, 2, 1), EVENTS), "superseded by version 2",
           "b v2 (placed after a v2 completed) read a v1")
    expect(nc.check_lineage(lineage(2, 2, 3), EVENTS), "never completed", "a read of an attempt that never completed")
    # b v1, placed before a v2 completed, read a v1: legitimate, and sink v1 read b v1.
    events_v1 = [line for line in EVENTS if "version 2" not in line]
    expect(nc.check_lineage(lineage(1, 1, 1), events_v1), None, "a single attempt of each")
    restarted = EVENTS + ["     2.000s sink version 1002 placed on d1",
                          "     2.100s sink version 1002 completed on d1 in 9.0 ms, 100 output bytes"]
    expect(nc.check_lineage(lineage(1002, 2, 2), restarted), None, "a version 1000 higher after a restart")
    expect(nc.check_lineage("", EVENTS), "names no writer", "an empty lineage")
    # A job manager SIGKILLed just after b v1 completed: the journal has it, the event log not.
    killed = [line for line in EVENTS[:4]] + [
        "     0.900s restored from the journal after a job manager restart (attempts running then run again, as new versions)",
        "     1.000s sink version 1000001 placed on d1",
        "     1.100s sink version 1000001 completed on d1 in 9.0 ms, 100 output bytes"]
    notes = []
    expect(nc.check_lineage(lineage(1000001, 1, 1), killed, notes), None,
           "b v1 restored as completed at a restart (not placed again) may be read")
    if not any("b[0] version 1" in n for n in notes):
        raise nc.Failure(f"the inferred completion is not noted: {notes}")
    rerun = killed[:5] + ["     0.950s b[0] version 1000001 placed on d2"] + killed[5:]
    expect(nc.check_lineage(lineage(1000001, 1, 1), rerun), "never completed",
           "b v1 running at the restart (placed again after it) may not be read")
    # Killed just after the sink completed: neither its completion nor the job's end reached
    # the event log (the job completed: its status says so, and names the sink's version).
    truncated = EVENTS[:-2] + ["     1.000s sink version 2 placed on d3 chained after b[0]"]
    notes = []
    expect(nc.check_lineage(lineage(2, 2, 2), truncated, notes, outputs={"sink[0]": 2}), None,
           "a completed job whose log lost its last lines")
    if not any("end of the completed job's log" in n for n in notes):
        raise nc.Failure(f"the inferred completion is not noted: {notes}")
    expect(nc.check_lineage(lineage(2, 2, 2), EVENTS, outputs={"sink[0]": 1}), "records version 1",
           "outputs that are not the attempt the job manager recorded for them")
    print("PASS")


if __name__ == "__main__":
    main()
