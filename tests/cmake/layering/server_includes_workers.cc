// Must not compile (layering_server_cannot_include_the_data_plane): the daemon's include path
// shows server/ and the engine facade only.
#include "server/job_manager.h"
#include "workers/device/device.h"
