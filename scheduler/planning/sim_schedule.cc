#include "scheduler/planning/sim_schedule.h"

namespace rp::planning {

int SimSchedule::Add(SimTask t) {
  const int id = static_cast<int>(tasks.size());
  if (t.resource >= static_cast<int>(order.size())) order.resize(static_cast<size_t>(t.resource) + 1);
  order[static_cast<size_t>(t.resource)].push_back(id);
  tasks.push_back(std::move(t));
  return id;
}

}  // namespace rp::planning
