// NCCL for communicators of one rank (nccl.h), on the runtime's streams: an
// all-reduce is a copy from the send to the receive buffer (none in place),
// ordered like any other work of its stream.
#include "nccl.h"

#include <cstring>

#include "src/runtime.h"

using gac_cuda_emu::internal::Runtime;

namespace {

// Runs `body` with the runtime locked; a missing driver or device is an
// unhandled CUDA error, as NCCL reports the runtime's errors.
template <typename Body>
ncclResult_t Nccl(Body&& body) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  if (rt.Begin() != cudaSuccess) return ncclUnhandledCudaError;
  return body(rt);
}

ncclComm* Find(Runtime& rt, const ncclComm_t comm) {
  const auto it = rt.comms.find(comm);
  return it == rt.comms.end() || it->second->destroyed ? nullptr : it->second.get();
}

std::size_t ElementBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

ncclResult_t NewComm(Runtime& rt, int device, ncclComm_t* comm) {
  if (device < 0 || device >= rt.num_devices) return ncclInvalidArgument;
  if (rt.Context(device).sticky != cudaSuccess) return ncclUnhandledCudaError;
  auto c = std::make_unique<ncclComm>();
  c->device = device;
  *comm = c.get();
  rt.comms.emplace(c.get(), std::move(c));
  return ncclSuccess;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = 22703;  // 2.27.3
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof *id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return Nccl([&](Runtime& rt) {
    if (comms == nullptr) return ncclInvalidArgument;
    if (ndev != 1) return ncclInvalidUsage;
    return NewComm(rt, devlist != nullptr ? devlist[0] : 0, comms);
  });
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  return Nccl([&](Runtime& rt) {
    if (comm == nullptr) return ncclInvalidArgument;
    if (nranks != 1 || rank != 0) return ncclInvalidUsage;
    int device = 0;
    if (rt.Bind(&device) != cudaSuccess) return ncclInvalidArgument;
    return NewComm(rt, device, comm);
  });
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return Nccl([&](Runtime& rt) {
    ncclComm* c = Find(rt, comm);
    if (c == nullptr) return ncclInvalidArgument;
    c->destroyed = true;
    return ncclSuccess;
  });
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return Nccl([&](Runtime& rt) {
    if (Find(rt, comm) == nullptr || count == nullptr) return ncclInvalidArgument;
    *count = 1;
    return ncclSuccess;
  });
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return Nccl([&](Runtime& rt) {
    if (Find(rt, comm) == nullptr || rank == nullptr) return ncclInvalidArgument;
    *rank = 0;
    return ncclSuccess;
  });
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return Nccl([&](Runtime& rt) {
    const ncclComm* c = Find(rt, comm);
    if (c == nullptr || device == nullptr) return ncclInvalidArgument;
    *device = c->device;
    return ncclSuccess;
  });
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Nccl([&](Runtime& rt) {
    for (auto it = rt.nccl_faults.begin(); it != rt.nccl_faults.end(); ++it) {
      if (--it->remaining == 0) {
        const ncclResult_t r = it->result;
        rt.nccl_faults.erase(it);
        return r;
      }
    }
    const ncclComm* c = Find(rt, comm);
    const std::size_t element = ElementBytes(datatype);
    if (c == nullptr || element == 0 || op < ncclSum || op >= ncclNumOps) return ncclInvalidArgument;
    // The stream must be of the communicator's device (NCCL launches on it).
    CUstream_st* s = nullptr;
    if (rt.Resolve(stream, false, &s) != cudaSuccess || s->device != c->device) return ncclUnhandledCudaError;
    const std::size_t bytes = count * element;
    if (bytes == 0) return ncclSuccess;
    if (!rt.IsDeviceRange(sendbuff, bytes) || !rt.IsDeviceRange(recvbuff, bytes)) return ncclInvalidArgument;
    std::uint64_t seq = 0;
    const cudaError_t e = rt.Enqueue(
        s,
        [sendbuff, recvbuff, bytes] {
          if (sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, bytes);
          return cudaSuccess;
        },
        {}, &seq);
    return e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  });
}

}  // extern "C"
