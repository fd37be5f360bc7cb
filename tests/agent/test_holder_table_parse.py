"""The holder scan's parse of a namespace's table that changed since its last parse
(agent/holders/proc.py): only the new lines are split, and the table is exactly the one
`parse_relevant` gives for the whole text — after mounts come and go, for other devices
asked about, and with an unparsable line (the same error, the same line number)."""

from __future__ import annotations

import random

import pytest

from unstick.agent.holders.proc import ParsedTables, table_of
from unstick.core.model.mount_identity import MountTable
from unstick.core.model.mountinfo import MountinfoError, parse_relevant

BASE = [
    "22 1 0:21 / /proc rw,nosuid - proc proc rw",
    "23 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
    "24 23 0:22 / /var/lib/kubelet rw shared:2 - tmpfs tmpfs rw",
]


def _line(i: int) -> str:
    pod = f"/var/lib/kubelet/pods/p{i % 7}/volumes/kubernetes.io~csi/pv-{i}/mount"
    return f"{100 + i} 24 0:{40 + i % 13} /vol-{i} {pod} rw shared:{50 + i} - tmpfs tmpfs rw"


def _text(ids: list[int]) -> str:
    return "\n".join([*BASE, *(_line(i) for i in ids)]) + "\n"


def _expected(text: str, devices: set[tuple[int, int]]) -> MountTable:
    return MountTable.of(*parse_relevant(text, devices))


def test_a_changed_table_parses_as_a_whole_parse_would() -> None:
    rnd = random.Random(23)
    ids = list(range(300))
    known = None
    for _ in range(40):
        rnd.shuffle(ids)
        ids = sorted({*ids[: rnd.randint(200, len(ids))], rnd.randint(300, 900)})
        devices = {(0, 40 + rnd.randint(0, 12)), (8, 1)}
        text = _text(ids)
        table, known = table_of(text, devices, known)
        assert table == _expected(text, devices)
        assert set(known) == set(text.strip().split("\n"))


def test_the_cache_per_namespace_gives_each_text_and_devices_their_own_table() -> None:
    parsed = ParsedTables()
    first, second = _text(list(range(50))), _text(list(range(1, 60)))
    for text in (first, second, first):
        for devices in ({(0, 41)}, {(0, 42), (0, 43)}):
            frozen = frozenset(devices)
            assert parsed.table("mnt:[1]", text, frozen) == _expected(text, devices)
            assert parsed.table("mnt:[2]", text, frozen) == _expected(text, devices)


def test_an_unparsable_line_is_the_same_error_with_its_line_number() -> None:
    text = _text(list(range(10)))
    _, known = table_of(text, {(0, 41)})
    broken = text + "7 x 0:1 / /mnt rw - tmpfs tmpfs rw\n"
    with pytest.raises(MountinfoError) as whole:
        parse_relevant(broken, {(0, 41)})
    with pytest.raises(MountinfoError) as incremental:
        table_of(broken, {(0, 41)}, known)
    assert str(incremental.value) == str(whole.value)
