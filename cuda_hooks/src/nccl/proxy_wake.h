// Waking NCCL's proxy threads when phos releases a communicator.
//
// NCCL's proxy service threads see a stop or an abort only between two
// poll() calls of 500 ms (the service thread and its UDS thread; a literal
// in NCCL since 2.14, no setting changes it), and ncclCommAbort and
// ncclCommDestroy join them: each communicator's release waited ~0.5 s,
// one rank after the other. libphos.so stands in for poll(): a poll of
// 500 ms issued by one of NCCL's proxy threads (told by the names NCCL
// gives them) also watches phos's eventfd, which the release signals while
// it destroys the communicators, so each thread sees its flag at once.
// Other polls are passed on untouched. On unless PHOS_NCCL_PROXY_WAKE=off.
#pragma once

namespace phos::hooks {

// While a release destroys communicators: NCCL's proxy polls return at once
// (as on a timeout, so the threads look at their flags again), until
// nccl_proxy_wake_end().
void nccl_proxy_wake_begin();
void nccl_proxy_wake_end();

}  // namespace phos::hooks
