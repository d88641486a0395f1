// The translation unit that owns the build's one precompiled ATen header (rp_torch_pch in
// RoundpipeTorch.cmake); every LibTorch target reuses it. It defines nothing.
