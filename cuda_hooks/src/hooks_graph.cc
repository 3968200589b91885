// CUDA graphs: the kernels of a graph run without a cuLaunchKernel each, so
// each executable graph's kernel nodes are counted when it is instantiated
// and credited at every launch.
#include <map>
#include <mutex>
#include <vector>

#include "driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {

std::mutex g_mu;
std::map<CUgraphExec, uint64_t> g_kernel_nodes;  // per executable graph

uint64_t kernel_nodes(CUgraph graph, int depth = 0) {
  size_t n = 0;
  if (depth > 16 || PHOS_REAL(cuGraphGetNodes)(graph, nullptr, &n) != CUDA_SUCCESS || n == 0) return 0;
  std::vector<CUgraphNode> nodes(n);
  if (PHOS_REAL(cuGraphGetNodes)(graph, nodes.data(), &n) != CUDA_SUCCESS) return 0;
  uint64_t kernels = 0;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type;
    if (PHOS_REAL(cuGraphNodeGetType)(node, &type) != CUDA_SUCCESS) continue;
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
      kernels++;
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child;
      if (PHOS_REAL(cuGraphChildGraphNodeGetGraph)(node, &child) == CUDA_SUCCESS) kernels += kernel_nodes(child, depth + 1);
    }
  }
  return kernels;
}

CUresult instantiated(CUresult r, CUgraphExec* exec, CUgraph graph) {
  if (r != CUDA_SUCCESS || !exec) return r;
  uint64_t n = kernel_nodes(graph);
  std::lock_guard<std::mutex> lock(g_mu);
  g_kernel_nodes[*exec] = n;
  return r;
}

CUresult launched(CUresult r, CUgraphExec exec) {
  if (r != CUDA_SUCCESS) return r;
  runtime().count(Counter::kGraphLaunches);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_kernel_nodes.find(exec);
  if (it != g_kernel_nodes.end()) runtime().count(Counter::kGraphKernels, it->second);
  return r;
}

}  // namespace

extern "C" PHOS_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  GatePass pass(runtime().gate);
  return instantiated(PHOS_REAL(cuGraphInstantiateWithFlags)(exec, graph, flags), exec, graph);
}

extern "C" PHOS_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                                             CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  GatePass pass(runtime().gate);
  return instantiated(PHOS_REAL(cuGraphInstantiateWithParams)(exec, graph, params), exec, graph);
}

extern "C" PHOS_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                                  CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  GatePass pass(runtime().gate);
  return instantiated(PHOS_REAL(cuGraphInstantiateWithParams_ptsz)(exec, graph, params), exec, graph);
}

extern "C" PHOS_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  GatePass pass(runtime().gate);
  CUresult r = PHOS_REAL(cuGraphExecDestroy)(exec);
  std::lock_guard<std::mutex> lock(g_mu);
  g_kernel_nodes.erase(exec);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  GatePass pass(runtime().gate);
  return launched(PHOS_REAL(cuGraphLaunch)(exec, stream), exec);
}

extern "C" PHOS_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  GatePass pass(runtime().gate);
  return launched(PHOS_REAL(cuGraphLaunch_ptsz)(exec, stream), exec);
}
