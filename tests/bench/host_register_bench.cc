// host_register_bench — a LoRA base used from its model file on the CUDA backend: registering the
// file's mapping for DMA (Device::RegisterHostMemory, cudaHostRegister read-only) against copying
// it into the pinned arena (EmptyHost + copy, what a refused registration falls back to), side by
// side in one run: setup time, the anonymous memory it adds (RssAnon), and the host-to-device
// bandwidth of a full upload from each source (and from the plain, unregistered mapping). Needs
// a CUDA GPU; prints why and exits 0 without one. A benchmark (a printed table), not a test.
//
//   build/tests/bench/host_register_bench [GiB=1] [dir=<tmp>]
//
// The file is written first (so its pages are in the page cache, as after a first load).
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "workers/device/device.h"
#include "workers/io/safetensors_reader.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t RssAnonBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8)) * 1024;
  }
  return -1;
}

// One bf16 tensor "w" of `bytes` bytes, written in 64 MiB pieces.
void WriteFile(const std::string& path, int64_t bytes) {
  std::string h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[" + std::to_string(bytes / 2) + "],\"data_offsets\":[0," +
                  std::to_string(bytes) + "]}}";
  while (h.size() % 8 != 0) h += ' ';  // 8-byte aligned data
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::vector<char> piece(int64_t{64} << 20);
  for (size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<char>(i * 131 + 7);
  for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(piece.size())) {
    out.write(piece.data(), static_cast<std::streamsize>(std::min<int64_t>(left, static_cast<int64_t>(piece.size()))));
  }
}

// Seconds for one upload of `host` to the GPU (synchronised).
double UploadSeconds(const at::Tensor& host) {
  at::Tensor dev = at::empty(host.sizes(), host.options().device(at::kCUDA));
  dev.copy_(host, /*non_blocking=*/true);  // warm the path once
  cudaDeviceSynchronize();
  const auto t0 = Clock::now();
  dev.copy_(host, /*non_blocking=*/true);
  cudaDeviceSynchronize();
  return Since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 1.0;
  const std::string dir = argc > 2 ? argv[2] : std::filesystem::temp_directory_path().string();
  if (rp::workers::VisibleCudaDevices() == 0) {
    std::printf("host_register_bench: no CUDA GPU visible; nothing measured\n");
    return 0;
  }
  const int64_t bytes = static_cast<int64_t>(gib * (1 << 30)) / 64 * 64;
  const std::string path = dir + "/rp_host_register_bench.safetensors";
  WriteFile(path, bytes);
  rp::workers::Timeline tl;
  auto devs = rp::workers::CreateDevices("cuda:0", &tl);
  if (!devs.ok()) {
    std::printf("host_register_bench: %s\n", std::string(devs.status().message()).c_str());
    return 1;
  }
  rp::workers::Device& d = *(*devs)[0];
  auto opened = rp::workers::io::SafetensorsFile::Open(path);
  if (!opened.ok()) {
    std::printf("host_register_bench: %s\n", std::string(opened.status().message()).c_str());
    return 1;
  }
  std::shared_ptr<const rp::workers::io::SafetensorsFile> file = std::move(*opened);
  at::Tensor view = *rp::workers::io::SafetensorsFile::View(file, "w");
  std::printf("host_register_bench: %.2f GiB base on %s\n", static_cast<double>(bytes) / (1 << 30),
              d.description().c_str());
  std::printf("%-36s %10s %12s %14s\n", "source", "setup s", "RssAnon +MiB", "upload GB/s");
  const double plain = UploadSeconds(view);
  std::printf("%-36s %10s %12s %14.2f\n", "mapping, unregistered (pageable)", "-", "0",
              static_cast<double>(bytes) / plain / 1e9);
  {
    const int64_t anon0 = RssAnonBytes();
    const auto t0 = Clock::now();
    auto handle = d.RegisterHostMemory(file->mapping(), file->mapping_bytes());
    const double setup = Since(t0);
    if (handle.ok()) {
      const double up = UploadSeconds(view);
      std::printf("%-36s %10.3f %12.0f %14.2f\n", "mapping, registered (cudaHostRegister)", setup,
                  static_cast<double>(RssAnonBytes() - anon0) / (1 << 20), static_cast<double>(bytes) / up / 1e9);
      const auto t1 = Clock::now();
      handle->reset();
      std::printf("  (unregistering took %.3f s)\n", Since(t1));
    } else {
      std::printf("%-36s refused: %s\n", "mapping, registered", std::string(handle.status().message()).c_str());
    }
  }
  {
    const int64_t anon0 = RssAnonBytes();
    const auto t0 = Clock::now();
    at::Tensor pinned = d.EmptyHost(view.sizes(), view.scalar_type());
    pinned.copy_(view);
    const double setup = Since(t0);
    const double up = UploadSeconds(pinned);
    std::printf("%-36s %10.3f %12.0f %14.2f\n", "pinned arena copy (the fallback)", setup,
                static_cast<double>(RssAnonBytes() - anon0) / (1 << 20), static_cast<double>(bytes) / up / 1e9);
  }
  std::filesystem::remove(path);
  return 0;
}
