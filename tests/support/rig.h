// rig.h — the engine pieces a controller test needs, built in one call: N CPU devices recording
// into one timeline, a HostModelStore, and a Controller. Header-only test support.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "scheduler/runtime/controller.h"
#include "workers/device/device.h"
#include "workers/store/host_model_store.h"

namespace rp::testing {

struct Rig {
  workers::Timeline timeline;
  std::vector<std::unique_ptr<workers::Device>> devices;
  std::unique_ptr<workers::HostModelStore> store;
  std::unique_ptr<scheduler::Controller> controller;  // destroyed first (declared last)

  std::vector<workers::Device*> raw_devices() const {
    std::vector<workers::Device*> out;
    for (const auto& d : devices) out.push_back(d.get());
    return out;
  }
};

// A failed Create is reported as a test failure and leaves `controller` null.
inline std::unique_ptr<Rig> MakeRig(const spec::ModelConfig& cfg, int num_devices,
                                    const scheduler::ControllerOptions& options, at::ScalarType master = at::kFloat,
                                    uint64_t seed = 1) {
  auto r = std::make_unique<Rig>();
  auto devs = workers::CreateDevices("cpu:" + std::to_string(num_devices), &r->timeline);
  EXPECT_TRUE(devs.ok()) << devs.status();
  if (!devs.ok()) return r;
  r->devices = std::move(*devs);
  r->store = std::make_unique<workers::HostModelStore>(cfg, master, seed);
  auto c = scheduler::Controller::Create(options, r->store.get(), r->raw_devices(), &r->timeline);
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) r->controller = std::move(*c);
  return r;
}

}  // namespace rp::testing
