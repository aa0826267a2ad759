"""The chunks of an MCAP file, and their checksums.

rosbags' MCAP writer leaves every chunk's CRC at 0, which the format reads as "not set": a reader then cannot tell
a chunk whose bytes were damaged (a failed copy, a bad disk) from a good one, and as long as the damage keeps the
records' structure the messages decode silently with wrong contents. `seal_chunks` writes each chunk's CRC-32 of
its records in place, after the writer closed the file; readers check a CRC that is set (rosbags' reader raises
`ReaderError: Chunk checksum mismatch`), so such damage stops the read, which `data.bag` reports as a damaged bag.

Layout (MCAP spec, "Chunk" record, opcode 0x06): opcode (1 byte), record length (uint64), message start time,
message end time, uncompressed size (uint64 each), uncompressed CRC-32 (uint32), compression (uint32 length and
the name), records length (uint64), records. All little-endian.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from typing import BinaryIO

MAGIC = b"\x89MCAP0\r\n"
CHUNK, DATA_END = 0x06, 0x0F
CRC_AT = 9 + 24  # from a chunk record's start: opcode, length, three uint64 fields
COMPRESSION_AT = CRC_AT + 4


def chunks(file: BinaryIO) -> Iterator[tuple[int, int]]:
    """(offset, record length) of every chunk record, in file order, walking the data section's records."""
    file.seek(0)
    if file.read(len(MAGIC)) != MAGIC:
        raise ValueError("not an MCAP file (no magic)")
    pos = len(MAGIC)
    while True:
        file.seek(pos)
        head = file.read(9)
        if len(head) < 9:
            return  # no data end record: a truncated file; its readers say so
        op, length = head[0], struct.unpack_from("<Q", head, 1)[0]
        if op == DATA_END:
            return
        if op == CHUNK:
            yield pos, length
        pos += 9 + length


def seal_chunks(path: str | os.PathLike) -> int:
    """Write the CRC-32 of each chunk's records into the chunk; returns how many chunks. Only uncompressed chunks
    (what rosbags writes by default) are sealed; a compressed one is a ValueError."""
    sealed = 0
    with open(path, "r+b") as file:
        for offset, _ in list(chunks(file)):
            file.seek(offset + COMPRESSION_AT)
            (name_len,) = struct.unpack("<I", file.read(4))
            if name_len:
                raise ValueError(f"{path}: chunk at byte {offset} is compressed ({file.read(name_len)!r}); only "
                                 "uncompressed chunks are sealed")
            (records_len,) = struct.unpack("<Q", file.read(8))
            crc = zlib.crc32(file.read(records_len))
            file.seek(offset + CRC_AT)
            file.write(struct.pack("<I", crc))
            sealed += 1
    return sealed
