"""Reading any rosbag2 (MCAP or sqlite3, ours or anyone's) without ROS: topics, raw CDR messages, decoding.

Replay needs the raw CDR bytes and log times only (it republishes them untouched); the report needs decoded
messages. Types are resolved from the kilted standard set, our own .msg files, and the definitions the bag
itself carries; a type none of those know is reported with the topics that use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rosbags.interfaces import MessageDefinitionFormat
from rosbags.rosbag2 import Reader
from rosbags.rosbag2.errors import ReaderError
from rosbags.typesys import get_types_from_msg
from rosbags.typesys.store import Typestore

from .episode import DataError
from .msgtypes import bag_typestore


class UnknownMessageTypeError(DataError):
    """The bag uses a message type with no known definition."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    msgtype: str
    count: int


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
    reader = Reader(path)
    try:
        reader.open()
    except (ReaderError, OSError, ValueError, KeyError) as err:
        raise DataError(f"{path}: not a readable rosbag2 ({err})") from err
    return reader


def bag_topics(path: str | os.PathLike) -> list[TopicInfo]:
    """Topics with their type and message count, sorted by name."""
    reader = open_reader(path)
    try:
        counts: dict[tuple[str, str], int] = {}
        for conn in reader.connections:
            key = (conn.topic, conn.msgtype)
            counts[key] = counts.get(key, 0) + conn.msgcount
        return sorted((TopicInfo(t, m, c) for (t, m), c in counts.items()), key=lambda i: i.name)
    finally:
        reader.close()


def iter_raw(path: str | os.PathLike, topics: Iterable[str] | None = None) -> Iterator[RawMessage]:
    """Messages in log-time order as raw CDR bytes; `topics` limits them (a topic not in the bag is an error)."""
    reader = open_reader(path)
    try:
        conns = reader.connections
        if topics is not None:
            wanted = set(topics)
            missing = wanted - {c.topic for c in conns}
            if missing:
                raise DataError(f"{path}: topics not in bag: {sorted(missing)}")
            conns = [c for c in conns if c.topic in wanted]
        for conn, timestamp, data in reader.messages(connections=conns):
            yield RawMessage(conn.topic, conn.msgtype, timestamp, bytes(data))
    finally:
        reader.close()


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


def read_messages(path: str | os.PathLike, topics: Iterable[str] | None = None) -> Iterator[tuple[RawMessage, Any]]:
    """(raw, decoded) pairs in log-time order, decoded with `typestore_for(path)`."""
    store = typestore_for(path)
    for raw in iter_raw(path, topics):
        yield raw, store.deserialize_cdr(raw.data, raw.msgtype)
