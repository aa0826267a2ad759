"""Reading any rosbag2 (MCAP or sqlite3, ours or anyone's) without ROS: topics, raw CDR messages, decoding.

Replay needs the raw CDR bytes and log times only (it republishes them untouched); the report needs decoded
messages. Types are resolved from the kilted standard set, our own .msg files, and the definitions the bag
itself carries; a type none of those know is reported with the topics that use it.

A bag is only as good as its storage file: a damaged chunk can make the reading library stop early or skip
messages without raising (a chunk whose checksum is set and wrong makes it stop). Every read is therefore counted
per topic against the counts metadata.yaml lists; a shortfall, or more messages than listed, is an
`IncompleteBagError` unless the caller accepts a partial bag (then it is reported to it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rosbags.interfaces import Connection, MessageDefinitionFormat, Qos
from rosbags.rosbag2 import Reader
from rosbags.rosbag2.errors import ReaderError
from rosbags.typesys import get_types_from_msg
from rosbags.typesys.store import Typestore

from .episode import DataError
from .msgtypes import bag_typestore


class UnknownMessageTypeError(DataError):
    """The bag uses a message type with no known definition."""


class IncompleteBagError(DataError):
    """The messages read from the storage are not those the bag's metadata lists: fewer (or the read stopped), or
    more."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    msgtype: str
    count: int
    qos: tuple[Qos, ...] = ()  # the QoS profiles the topic's publishers offered when it was recorded


@dataclass(frozen=True)
class RawMessage:
    topic: str
    msgtype: str
    log_time_ns: int
    data: bytes


def open_reader(path: str | os.PathLike) -> Reader:
    """An opened rosbags Reader; an unreadable bag raises DataError naming the path."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such bag")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        raise DataError(f"{path}: no metadata.yaml (not a rosbag2 folder, or its recording never finished; "
                        "`ros2 bag reindex` rebuilds it)")
    try:
        reader = Reader(path)
        reader.open()
    except (ReaderError, OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path}: not a readable rosbag2 ({err})") from err
    for conn in reader.connections:
        if isinstance(conn.msgcount, bool) or not isinstance(conn.msgcount, int) or conn.msgcount < 0:
            reader.close()
            raise DataError(f"{path}: metadata.yaml gives {conn.topic} a message count of {conn.msgcount!r}")
    return reader


def bag_topics(path: str | os.PathLike) -> list[TopicInfo]:
    """Topics with their type, message count and offered QoS profiles, sorted by name."""
    reader = open_reader(path)
    try:
        counts: dict[tuple[str, str], int] = {}
        profiles: dict[tuple[str, str], list[Qos]] = {}
        for conn in reader.connections:
            key = (conn.topic, conn.msgtype)
            counts[key] = counts.get(key, 0) + conn.msgcount
            offered = profiles.setdefault(key, [])
            offered += [q for q in getattr(conn.ext, "offered_qos_profiles", []) if q not in offered]
        return sorted((TopicInfo(t, m, c, tuple(profiles[t, m])) for (t, m), c in counts.items()),
                      key=lambda i: i.name)
    finally:
        reader.close()


def iter_raw(path: str | os.PathLike, topics: Iterable[str] | None = None,
             on_incomplete: Callable[[str], None] | None = None) -> Iterator[RawMessage]:
    """Messages in log-time order as raw CDR bytes; `topics` limits them (a topic not in the bag is an error).

    After the last message the counts read are checked against the metadata: a shortfall, more messages than
    listed, or a storage error that ends the reading early raises IncompleteBagError, or is passed as one line to
    `on_incomplete`.
    """
    reader = open_reader(path)
    try:
        conns = reader.connections
        if topics is not None:
            wanted = set(topics)
            missing = wanted - {c.topic for c in conns}
            if missing:
                raise DataError(f"{path}: topics not in bag: {sorted(missing)}")
            conns = [c for c in conns if c.topic in wanted]
        read = dict.fromkeys((c.id for c in conns), 0)
        messages, stopped_by = reader.messages(connections=conns), None
        while True:
            try:
                item = next(messages, None)
            except Exception as err:  # whatever a damaged storage file makes the library raise
                stopped_by = f"{type(err).__name__}: {err}"
                break
            if item is None:
                break
            conn, timestamp, data = item
            read[conn.id] += 1
            yield RawMessage(conn.topic, conn.msgtype, timestamp, bytes(data))
        problem = _count_problem(path, conns, read, stopped_by)
    finally:
        reader.close()
    if problem is not None:
        if on_incomplete is None:
            raise IncompleteBagError(problem)
        on_incomplete(problem)


def _count_problem(path: str | os.PathLike, conns: list[Connection], read: dict[int, int],
                   stopped_by: str | None) -> str | None:
    """One line naming each topic with fewer (or more) messages read than its metadata count; None if all match."""
    expected: dict[str, int] = {}
    got: dict[str, int] = {}
    for conn in conns:
        expected[conn.topic] = expected.get(conn.topic, 0) + conn.msgcount
        got[conn.topic] = got.get(conn.topic, 0) + read[conn.id]
    short = [f"{topic} {got[topic]} of {n}" for topic, n in expected.items() if got[topic] < n]
    extra = [f"{topic} {got[topic]} where it lists {n}" for topic, n in expected.items() if got[topic] > n]
    if extra and not short and stopped_by is None:
        return f"{path}: the storage holds more messages than metadata.yaml lists, per topic: {', '.join(extra)}"
    if not short and not extra and stopped_by is None:
        return None
    detail = f"messages readable per topic: {', '.join(short + extra)}" if short or extra else "reading failed"
    cause = f" (storage read stopped: {stopped_by})" if stopped_by else ""
    return f"{path}: damaged or incomplete bag, {detail}{cause}"


def bag_problem(path: str | os.PathLike, topics: Iterable[str] | None = None) -> str | None:
    """Read every message once (no decoding); the one-line integrity problem, or None for an intact bag."""
    problems: list[str] = []
    for _ in iter_raw(path, topics, on_incomplete=problems.append):
        pass
    return problems[0] if problems else None


def typestore_for(path: str | os.PathLike) -> Typestore:
    """Standard + our types, plus any definitions stored in the bag; unknown types raise with their topics."""
    store = bag_typestore()
    reader = open_reader(path)
    try:
        extra, unknown = {}, {}
        for conn in reader.connections:
            if conn.msgtype in store.types or conn.msgtype in extra:
                continue
            if conn.msgdef.format == MessageDefinitionFormat.MSG and conn.msgdef.data:
                extra.update(get_types_from_msg(conn.msgdef.data, conn.msgtype))
            else:
                unknown.setdefault(conn.msgtype, []).append(conn.topic)
    finally:
        reader.close()
    if unknown:
        listed = "; ".join(f"{t} (topics {sorted(ts)})" for t, ts in unknown.items())
        raise UnknownMessageTypeError(f"{path}: unknown message types without definitions in the bag: {listed}")
    store.register(extra)
    return store


def read_messages(path: str | os.PathLike, topics: Iterable[str] | None = None,
                  on_incomplete: Callable[[str], None] | None = None) -> Iterator[tuple[RawMessage, Any]]:
    """(raw, decoded) pairs in log-time order, decoded with `typestore_for(path)` (integrity as in iter_raw).

    A message whose bytes do not decode as its type raises DataError naming the topic and log time.
    """
    store = typestore_for(path)
    for raw in iter_raw(path, topics, on_incomplete):
        try:
            message = store.deserialize_cdr(raw.data, raw.msgtype)
        except Exception as err:  # the CDR decoder raises many kinds on malformed bytes
            raise DataError(f"{path}: {raw.topic} message at log time {raw.log_time_ns} does not decode as "
                            f"{raw.msgtype} ({type(err).__name__}: {err})") from err
        yield raw, message
