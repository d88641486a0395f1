// bf16_model_dir.h — test support: a Hugging Face model directory written without Python.
#pragma once

#include <cstdint>
#include <string>

#include "workers/spec/model_config.h"

namespace rp::testing {

// A Hugging Face model directory (config.json + model.safetensors, bf16) written in 1 MiB pieces
// from a small generator, so making it costs the test no anonymous memory; `sparse`: the header
// alone and a hole for the data (a file of any size that costs no disk). Returns the data bytes.
int64_t WriteBf16ModelDir(const std::string& dir, const spec::ModelConfig& c, bool sparse = false);

}  // namespace rp::testing
