// tokenizer_bench — encoding throughput of the native tokenizer.json reader (workers/text), one
// thread, on the documents of make_tokenizers.py. Prints one row per tokenizer; run it through
// tokenizer_bench.sh, which also times PyPI's `tokenizers` on the same documents in the same run.
//
//   tokenizer_bench DOCS_JSON NAME=TOKENIZER_JSON [NAME=TOKENIZER_JSON ...]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "workers/text/tokenizer.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DOCS_JSON NAME=TOKENIZER_JSON...\n", argv[0]);
    return 2;
  }
  const auto docs = nlohmann::json::parse(ReadFile(argv[1])).get<std::vector<std::string>>();
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::printf("%-12s %10s %10s %10s\n", "tokenizer", "MB", "ids", "MB/s(ours)");
  for (int a = 2; a < argc; ++a) {
    const std::string arg = argv[a];
    const size_t eq = arg.find('=');
    auto tok = rp::workers::text::Tokenizer::FromJson(ReadFile(arg.substr(eq + 1)));
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", arg.c_str(), std::string(tok.status().message()).c_str());
      return 1;
    }
    double best = 1e30;
    size_t ids = 0;
    for (int rep = 0; rep < 3; ++rep) {
      ids = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& d : docs) ids += tok->Encode(d).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%-12s %10.2f %10zu %10.2f\n", arg.substr(0, eq).c_str(), bytes / 1e6, ids, bytes / 1e6 / best);
  }
  return 0;
}
