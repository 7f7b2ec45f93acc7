// UnaryCall: the part every unary handler of gacd shares. It counts the call
// as open in the Core until it finishes (shutdown waits for open calls),
// authorises it, finishes it exactly once with OK or an error (errors are
// counted per method and code), and runs slow work on the executor:
//
//   UnaryCall call(core_, "GetSteps", ctx);
//   Status st = ValidateRunId(req->run());
//   if (st.ok()) st = call.Authorize(kRead, req->run()).status();
//   if (!st.ok()) return call.Finish(st);
//   return call.ReplyInBackground(resp, [=] { return ReadThePage(); });
//
// A copyable handle (a core, a method name and gRPC's reactor): copies may
// be captured by callbacks; exactly one Finish* per call.
#ifndef GAC_SERVER_SRC_UNARY_CALL_H_
#define GAC_SERVER_SRC_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "server/src/core.h"

namespace gac::server {

class UnaryCall {
 public:
  UnaryCall(Core* core, const char* method, grpc::CallbackServerContext* ctx)
      : core_(core), method_(method), ctx_(ctx), reactor_(ctx->DefaultReactor()) {
    core_->CallStarted();
  }

  base::StatusOr<const Principal*> Authenticate() const { return core_->Authenticate(*ctx_); }
  base::StatusOr<const Principal*> Authorize(Right right, const std::string& run) const {
    return core_->Authorize(*ctx_, right, run);
  }

  // Ends the call; returns the reactor for the handler to return.
  grpc::ServerUnaryReactor* Finish(const base::Status& status) const {
    reactor_->Finish(status.ok() ? grpc::Status::OK : core_->Fail(method_, status));
    core_->CallFinished();
    return reactor_;
  }

  // Runs `work` (returning a Status) on the executor, then finishes with its
  // result. Returns the reactor for the handler to return.
  template <typename Work>
  grpc::ServerUnaryReactor* FinishInBackground(Work work) const {
    const UnaryCall call = *this;
    core_->executor().Post([call, work = std::move(work)]() mutable { call.Finish(work()); });
    return reactor_;
  }

  // Runs `work` (returning a StatusOr<Response>) on the executor; the value
  // becomes the response, and the call finishes with its status.
  template <typename Response, typename Work>
  grpc::ServerUnaryReactor* ReplyInBackground(Response* response, Work work) const {
    return FinishInBackground([response, work = std::move(work)]() mutable {
      auto result = work();
      if (result.ok()) *response = std::move(*result);
      return result.status();
    });
  }

  // gRPC's reactor of the call (what a handler returns). Never call the
  // context's DefaultReactor() again: it would start a new one.
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }

 private:
  Core* core_;
  const char* method_;
  grpc::CallbackServerContext* ctx_;  // valid until Finish
  grpc::ServerUnaryReactor* reactor_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_UNARY_CALL_H_
