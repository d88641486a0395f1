// byte_level.h — the byte-level alphabet of GPT-2-style BPE tokenizers (Llama-3, Qwen2/Qwen3,
// GPT-OSS): every byte 0..255 is written as one printable Unicode character, so that a BPE
// vocabulary over those characters can spell any byte string. Printable Latin-1 bytes ('!'..'~',
// '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 take U+0100.. in byte order.
//
// Contract: pure functions over a constant table, any thread; never throw.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rp::workers::text {

// Appends the byte-level spelling (UTF-8) of `bytes` to `out`.
void ByteLevelEncode(std::string_view bytes, std::string* out);

// The byte a byte-level character stands for, or -1 when `codepoint` is not in the alphabet.
int ByteLevelByte(uint32_t codepoint);

// Appends the bytes `token` spells to `out` when every character of `token` is in the alphabet
// and returns true; otherwise appends `token` unchanged and returns false (what Hugging Face's
// ByteLevel decoder does with added tokens such as "<|endoftext|>" or non-Latin content).
bool ByteLevelDecodeToken(std::string_view token, std::string* out);

// Decodes one UTF-8 character at `s[*pos]` and advances `*pos`; malformed input yields U+FFFD
// and advances one byte.
uint32_t NextCodepoint(std::string_view s, size_t* pos);

// Appends `codepoint` as UTF-8.
void AppendUtf8(uint32_t codepoint, std::string* out);

// `bytes` with every malformed UTF-8 sequence replaced by U+FFFD (as Rust's from_utf8_lossy).
std::string Utf8Lossy(std::string_view bytes);

}  // namespace rp::workers::text
