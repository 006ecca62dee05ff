#!/usr/bin/env python3
"""Writes the GGUF fuzzer's seed corpus: small valid files that reach every loader.

Kept in the repository (fuzz/seeds/) so CI needs no generator; rerun after format changes:
    python3 fuzz/make_seeds.py fuzz/seeds
"""
import struct
import sys
from pathlib import Path

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def arr(etype, items):
    return struct.pack("<IQ", etype, len(items)) + b"".join(items)


def gguf(kvs, tensors, alignment=32):
    """tensors: list of (name, dims, ggml_type, data_bytes)."""
    out = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs)) + b"".join(kvs)
    offset, blobs = 0, []
    for name, dims, ttype, data in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        padded = data + b"\0" * ((-len(data)) % alignment)
        blobs.append(padded)
        offset += len(padded)
    out += b"\0" * ((-len(out)) % alignment)
    return out + b"".join(blobs)


def f32s(values):
    return b"".join(struct.pack("<f", v) for v in values)


def tiny_llama():
    n_embd, n_ff, n_vocab, n_head, n_kv = 32, 64, 264, 2, 1
    head_dim = n_embd // n_head
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "\u2581H", "e", "l", "o"]
    kvs = [
        kv("general.architecture", STR, s("llama")),
        kv("llama.embedding_length", U32, struct.pack("<I", n_embd)),
        kv("llama.block_count", U32, struct.pack("<I", 1)),
        kv("llama.feed_forward_length", U32, struct.pack("<I", n_ff)),
        kv("llama.attention.head_count", U32, struct.pack("<I", n_head)),
        kv("llama.attention.head_count_kv", U32, struct.pack("<I", n_kv)),
        kv("llama.context_length", U32, struct.pack("<I", 64)),
        kv("tokenizer.ggml.model", STR, s("llama")),
        kv("tokenizer.ggml.tokens", ARR, arr(STR, [s(t) for t in tokens])),
        kv("tokenizer.ggml.scores", ARR, arr(F32, [struct.pack("<f", -i) for i in range(len(tokens))])),
        kv("tokenizer.ggml.token_type", ARR,
           arr(I32, [struct.pack("<i", 2 if i == 0 else 3 if i < 3 else 6 if i < 259 else 1) for i in range(len(tokens))])),
    ]

    def mat(name, cols, rows, ttype=0):
        if ttype == 8:  # Q8_0: fp16 scale 1.0 then 32 int8 per block
            data = (struct.pack("<H", 0x3C00) + bytes(range(32))) * (cols * rows // 32)
        else:
            data = f32s([((i * 7) % 13 - 6) / 10 for i in range(cols * rows)])
        return (name, [cols, rows], ttype, data)

    tensors = [mat("token_embd.weight", n_embd, n_vocab, 8), ("output_norm.weight", [n_embd], 0, f32s([1.0] * n_embd)),
               ("blk.0.attn_norm.weight", [n_embd], 0, f32s([1.0] * n_embd)),
               ("blk.0.ffn_norm.weight", [n_embd], 0, f32s([1.0] * n_embd)),
               mat("blk.0.attn_q.weight", n_embd, n_embd), mat("blk.0.attn_k.weight", n_embd, head_dim * n_kv),
               mat("blk.0.attn_v.weight", n_embd, head_dim * n_kv), mat("blk.0.attn_output.weight", n_embd, n_embd),
               mat("blk.0.ffn_gate.weight", n_embd, n_ff, 8), mat("blk.0.ffn_up.weight", n_embd, n_ff),
               mat("blk.0.ffn_down.weight", n_ff, n_embd)]
    return gguf(kvs, tensors)


def every_value_type():
    kvs = [
        kv("u8", U8, struct.pack("<B", 7)), kv("i8", I8, struct.pack("<b", -7)),
        kv("u16", U16, struct.pack("<H", 700)), kv("i16", I16, struct.pack("<h", -700)),
        kv("u32", U32, struct.pack("<I", 70000)), kv("i32", I32, struct.pack("<i", -70000)),
        kv("f32", F32, struct.pack("<f", 1.5)), kv("b", BOOL, b"\x01"), kv("s", STR, s("text")),
        kv("u64", U64, struct.pack("<Q", 1 << 40)), kv("i64", I64, struct.pack("<q", -(1 << 40))),
        kv("f64", F64, struct.pack("<d", 2.5)),
        kv("nested", ARR, arr(ARR, [arr(U8, [b"\x01", b"\x02"]), arr(STR, [s("x")])])),
        kv("general.alignment", U32, struct.pack("<I", 64)),
    ]
    return gguf(kvs, [("t", [4], 0, f32s([1, 2, 3, 4])), ("q", [32, 2], 2, b"\x00\x3c" + bytes(16) + b"\x00\x3c" + bytes(16))],
                alignment=64)


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fuzz/seeds")
    out.mkdir(parents=True, exist_ok=True)
    (out / "tiny_llama.gguf").write_bytes(tiny_llama())
    (out / "value_types.gguf").write_bytes(every_value_type())
    (out / "empty.gguf").write_bytes(gguf([], []))


if __name__ == "__main__":
    main()
