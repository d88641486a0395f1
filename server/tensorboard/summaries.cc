// TensorBoard events (summaries.h).
#include "server/tensorboard/summaries.h"

#include "tensorboard/event.pb.h"

namespace rp::tensorboard {
namespace {

namespace pb = ::roundpipe::tensorboard;

pb::Event Stamped(int64_t step, double wall_time) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  return e;
}

}  // namespace

std::string FileVersionEvent(double wall_time) {
  pb::Event e = Stamped(0, wall_time);
  e.set_file_version("brain.Event:2");
  return e.SerializeAsString();
}

std::string ScalarsEvent(int64_t step, const std::vector<std::pair<std::string, double>>& scalars, double wall_time) {
  pb::Event e = Stamped(step, wall_time);
  pb::Summary* s = e.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    pb::SummaryValue* v = s->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return e.SerializeAsString();
}

std::string TextEvent(int64_t step, const std::string& tag, const std::string& markdown, double wall_time) {
  pb::Event e = Stamped(step, wall_time);
  pb::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  v->mutable_metadata()->set_data_class(pb::DATA_CLASS_TENSOR);
  pb::TensorValue* t = v->mutable_tensor();
  t->set_dtype(pb::DT_STRING);
  t->mutable_tensor_shape();  // a scalar string
  t->add_string_val(markdown);
  return e.SerializeAsString();
}

std::string HParamsEvent(const std::vector<std::pair<std::string, std::variant<std::string, double, bool>>>& hparams,
                         const std::string& group, double wall_time) {
  pb::HParamsPluginData data;
  pb::HParamsSessionStart* start = data.mutable_session_start_info();
  start->set_group_name(group);
  start->set_start_time_secs(wall_time);
  for (const auto& [name, value] : hparams) {
    google::protobuf::Value& out = (*start->mutable_hparams())[name];
    if (const auto* s = std::get_if<std::string>(&value)) out.set_string_value(*s);
    if (const auto* d = std::get_if<double>(&value)) out.set_number_value(*d);
    if (const auto* b = std::get_if<bool>(&value)) out.set_bool_value(*b);
  }
  pb::Event e = Stamped(0, wall_time);
  pb::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(kHParamsTag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("hparams");
  v->mutable_metadata()->mutable_plugin_data()->set_content(data.SerializeAsString());
  pb::TensorValue* t = v->mutable_tensor();  // the plugin's values carry an unused scalar
  t->set_dtype(pb::DT_FLOAT);
  t->mutable_tensor_shape();
  t->add_float_val(0);
  return e.SerializeAsString();
}

RecordInfo DescribeRecord(const std::string& record) {
  pb::Event e;
  RecordInfo r;
  if (!e.ParseFromString(record)) return r;
  r.parsed = true;
  r.step = e.step();
  r.header = e.what_case() == pb::Event::kFileVersion;
  for (const pb::SummaryValue& v : e.summary().value()) {
    r.hparams = r.hparams || v.tag() == kHParamsTag;
    r.tags.push_back(v.tag());
  }
  return r;
}

}  // namespace rp::tensorboard
