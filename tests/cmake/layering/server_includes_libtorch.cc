// Must not compile (layering_server_cannot_include_libtorch): LibTorch is the engine's private
// dependency.
#include <ATen/core/Tensor.h>
#include "scheduler/engine.h"
