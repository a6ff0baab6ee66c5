#!/usr/bin/env python3
"""Cuts the white below a page's content off a screenshot (an 8-bit RGB or RGBA PNG without
interlacing, as chromium writes them), keeping a margin: python3 png_cut_below.py FILE [MARGIN].
Used by report-screenshots.sh, so a whole report page can be shot through a window taller than
any page without needing ImageMagick."""
import struct
import sys
import zlib


def rows(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    i, idat = 8, b""
    while i < len(data):
        n, kind = struct.unpack(">I4s", data[i : i + 8])
        body = data[i + 8 : i + 8 + n]
        i += 12 + n
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, "unsupported PNG"
        elif kind == b"IDAT":
            idat += body
    bpp = 3 if colour == 2 else 4
    raw, stride, out = zlib.decompress(idat), w * bpp, []
    prev, p = bytearray(stride), 0
    for _ in range(h):
        kind, line = raw[p], bytearray(raw[p + 1 : p + 1 + stride])
        p += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    return w, colour, bpp, out


def write(path, w, colour, rows):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    head = struct.pack(">IIBBBBB", w, len(rows), 8, colour, 0, 0, 0)
    body = zlib.compress(b"".join(b"\0" + r for r in rows), 9)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def main():
    path, margin = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 24
    w, colour, bpp, image = rows(path)
    white = bytes([255] * bpp)
    last = max((y for y, r in enumerate(image) if r.replace(white, b"") != b""), default=0)
    write(path, w, colour, image[: min(len(image), last + 1 + margin)])


main()
