// RequestTable<T>: the per-request states of a proposer, and the argument checks every
// proposer applies (the error rules of proposer.h), written once.
//
// T needs `int64_t length() const` (history length) and a `uint64_t batch_mark` member.
// Messages name the owner ("ngram proposer", "suffix proposer") and the request.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "specd/span.h"
#include "specd/status.h"

namespace specd::detail {

template <class T>
class RequestTable {
 public:
  explicit RequestTable(const char* owner) : owner_(owner) {}

  Status find(int64_t id, T** out) const {
    const auto it = map_.find(id);
    if (it == map_.end()) return error_status(StatusCode::kNotFound, owner_, ": unknown request ", id);
    *out = it->second.get();
    return Status::Ok();
  }
  bool contains(int64_t id) const { return map_.count(id) != 0; }
  int64_t length(int64_t id) const {
    const auto it = map_.find(id);
    return it == map_.end() ? -1 : it->second->length();
  }
  int64_t size() const { return static_cast<int64_t>(map_.size()); }
  void insert(int64_t id, std::unique_ptr<T> state) { map_.emplace(id, std::move(state)); }
  void erase(int64_t id) { map_.erase(id); }
  template <class Fn>
  void for_each(Fn fn) const {
    for (const auto& kv : map_) fn(*kv.second);
  }

  // add_request: a new id, 1..max_history tokens, all >= 0.
  Status check_add(int64_t id, Span<const int32_t> prompt, int64_t max_history) const {
    if (contains(id)) return error_status(StatusCode::kAlreadyExists, owner_, ": request ", id, " already exists");
    if (prompt.empty())
      return error_status(StatusCode::kInvalidArgument, "request ", id,
                          ": the prompt must hold >= 1 token (the draft tree's root)");
    if (static_cast<int64_t>(prompt.size()) > max_history)
      return error_status(StatusCode::kInvalidArgument, "request ", id, ": prompt of ", prompt.size(),
                          " tokens exceeds ", max_history);
    return check_tokens(id, prompt);
  }

  // append: tokens >= 0 that keep the history within max_history.
  Status check_append(int64_t id, const T& state, Span<const int32_t> tokens, int64_t max_history) const {
    SPECD_RETURN_IF_ERROR(check_tokens(id, tokens));
    if (static_cast<int64_t>(tokens.size()) > max_history - state.length())
      return error_status(StatusCode::kInvalidArgument, "request ", id, ": appending ", tokens.size(),
                          " tokens to ", state.length(), " exceeds ", max_history);
    return Status::Ok();
  }

  // truncate: 1 <= new_len <= length.
  static Status check_truncate(int64_t id, const T& state, int64_t new_len) {
    if (new_len < 1)
      return error_status(StatusCode::kInvalidArgument, "request ", id, ": truncate to ", new_len,
                          "; a history keeps >= 1 token");
    if (new_len > state.length())
      return error_status(StatusCode::kOutOfRange, "request ", id, ": truncate to ", new_len,
                          " but the history holds ", state.length(), " tokens");
    return Status::Ok();
  }

  // propose_batch: equal sizes, known and distinct ids, max_depth and max_nodes >= 0. On
  // success `out` holds the states in the order of `ids`.
  Status gather(Span<const int64_t> ids, Span<const int32_t> max_depth, Span<const int32_t> max_nodes,
                std::vector<T*>* out) {
    if (max_depth.size() != ids.size() || max_nodes.size() != ids.size())
      return error_status(StatusCode::kInvalidArgument, "propose_batch: ", ids.size(), " ids but ",
                          max_depth.size(), " max_depth and ", max_nodes.size(), " max_nodes");
    ++stamp_;
    out->clear();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      T* state = nullptr;
      SPECD_RETURN_IF_ERROR(find(ids[i], &state));
      if (state->batch_mark == stamp_)
        return error_status(StatusCode::kInvalidArgument, "propose_batch: request ", ids[i], " appears twice");
      state->batch_mark = stamp_;
      if (max_depth[i] < 0 || max_nodes[i] < 0)
        return error_status(StatusCode::kInvalidArgument, "propose_batch: request ", ids[i], " has max_depth ",
                            max_depth[i], ", max_nodes ", max_nodes[i], "; both must be >= 0");
      out->push_back(state);
    }
    return Status::Ok();
  }

  static Status check_tokens(int64_t id, Span<const int32_t> tokens) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0)
        return error_status(StatusCode::kInvalidArgument, "request ", id, ": token ", i, " is ", tokens[i],
                            "; history tokens must be >= 0");
    return Status::Ok();
  }

 private:
  std::unordered_map<int64_t, std::unique_ptr<T>> map_;
  uint64_t stamp_ = 0;
  const char* owner_;
};

}  // namespace specd::detail
