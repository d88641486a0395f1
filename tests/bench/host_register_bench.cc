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

#include <algorithm>
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

// The bandwidth of one upload of `host` to the GPU, in 64 MiB pieces each synchronised, so that
// a slow or stalled source shows where: the first piece's time goes to stderr at once, and the
// upload stops after `deadline_s` (the rate then covers the pieces that finished, and says so).
// The whole tensor is copied once beforehand (the path warmed) unless that too passes the deadline.
struct UploadRate {
  double gb_per_s = 0;
  bool finished = false;
  int64_t bytes = 0;
};

UploadRate TimedUpload(const at::Tensor& host, double deadline_s) {
  const at::Tensor src = host.view(at::kByte);
  at::Tensor dev = at::empty(src.sizes(), src.options().device(at::kCUDA));
  const int64_t piece = int64_t{64} << 20;
  UploadRate r;
  for (int pass = 0; pass < 2; ++pass) {
    const auto t0 = Clock::now();
    int64_t done = 0;
    for (; done < src.numel(); done += piece) {
      const int64_t n = std::min(piece, src.numel() - done);
      dev.narrow(0, done, n).copy_(src.narrow(0, done, n), /*non_blocking=*/true);
      cudaDeviceSynchronize();
      if (done == 0)
        std::fprintf(stderr, "  pass %d: first %lld bytes in %.4f s\n", pass, static_cast<long long>(n), Since(t0));
      if (Since(t0) > deadline_s) {
        done += n;
        break;
      }
    }
    done = std::min(done, src.numel());
    r = UploadRate{static_cast<double>(done) / Since(t0) / 1e9, done == src.numel(), done};
    if (!r.finished) break;
  }
  return r;
}

std::string RateCell(const UploadRate& r) {
  char cell[96];
  if (r.finished) {
    std::snprintf(cell, sizeof cell, "%14.2f", r.gb_per_s);
  } else {
    std::snprintf(cell, sizeof cell, "%14.4f  (stopped after %lld MiB)", r.gb_per_s,
                  static_cast<long long>(r.bytes >> 20));
  }
  return cell;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row reaches a log even if the run is killed
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
  const double deadline_s = 20;
  std::printf("%-36s %10s %12s %s\n", "mapping, unregistered (pageable)", "-", "0",
              RateCell(TimedUpload(view, deadline_s)).c_str());
  {
    const int64_t anon0 = RssAnonBytes();
    const auto t0 = Clock::now();
    auto handle = d.RegisterHostMemory(file->mapping(), file->mapping_bytes());
    const double setup = Since(t0);
    if (handle.ok()) {
      std::printf("%-36s %10.3f", "mapping, registered (cudaHostRegister)", setup);
      const std::string rate = RateCell(TimedUpload(view, deadline_s));
      std::printf(" %12.0f %s\n", static_cast<double>(RssAnonBytes() - anon0) / (1 << 20), rate.c_str());
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
    std::printf("%-36s %10.3f %12.0f %s\n", "pinned arena copy (the fallback)", setup,
                static_cast<double>(RssAnonBytes() - anon0) / (1 << 20),
                RateCell(TimedUpload(pinned, deadline_s)).c_str());
  }
  std::filesystem::remove(path);
  return 0;
}
