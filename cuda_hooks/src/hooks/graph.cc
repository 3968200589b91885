// CUDA graphs: the kernels of a graph run without a cuLaunchKernel each, so
// each executable graph's kernel nodes are counted when it is instantiated
// and credited at every launch. While speculation is on, each kernel node's
// arguments are copied aside at instantiation (the graph they came from may
// be destroyed), its kernel looked up in the kernel registry then, and
// speculated at every launch of the graph. Updates of an
// executable graph's node parameters (cuGraphExecKernelNodeSetParams,
// cuGraphExecUpdate) are not followed yet.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "driver/driver.h"
#include "modules/kernel_info.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {

// What the graph hooks use: the gate, the counters, the kernel registry and
// the speculation (a graph's kernel nodes), a dump's copy window.
struct GraphDeps : RuntimeView {
  using RuntimeView::copy_window;
  using RuntimeView::counters;
  using RuntimeView::gate;
  using RuntimeView::kernels;
  using RuntimeView::speculation;
};

std::mutex g_mu;
std::map<CUgraphExec, uint64_t> g_kernel_nodes;  // per executable graph

struct NodeKernel {
  // Its registry entry (kernel_registry.h): entries live for ever, and the
  // graph cannot outlive its kernels' module.
  Kernel* kernel = nullptr;
  std::vector<std::byte> args;  // packed by the driver's parameter layout
};
std::map<CUgraphExec, std::vector<NodeKernel>> g_node_kernels;  // while speculating

// The node's kernel and a copy of its arguments; no arguments where the
// layout is not known (the speculation then scans nothing and says unknown).
NodeKernel node_kernel(GraphDeps rt, CUgraphNode node) {
  NodeKernel k;
  CUDA_KERNEL_NODE_PARAMS p{};
  if (PHOS_REAL(cuGraphKernelNodeGetParams_v2)(node, &p) != CUDA_SUCCESS) return k;
  CUfunction function = p.func ? p.func : reinterpret_cast<CUfunction>(p.kern);
  if (!function) return k;
  k.kernel = &rt.kernels().get(function);
  if (p.kernelParams) {
    const auto& slots = k.kernel->params;
    if (!slots) return k;
    size_t end = 0;
    for (const ParamSlot& s : *slots) end = std::max<size_t>(end, s.offset + s.size);
    k.args.resize(end);
    for (size_t i = 0; i < slots->size(); i++)
      std::memcpy(k.args.data() + (*slots)[i].offset, p.kernelParams[i], (*slots)[i].size);
  } else if (p.extra) {
    PackedArgs packed = packed_args(p.extra);
    if (packed.data) k.args.assign(packed.data, packed.data + packed.size);
  }
  return k;
}

uint64_t kernel_nodes(GraphDeps rt, CUgraph graph, std::vector<NodeKernel>* kernels, int depth = 0) {
  size_t n = 0;
  if (depth > 16 || PHOS_REAL(cuGraphGetNodes)(graph, nullptr, &n) != CUDA_SUCCESS || n == 0) return 0;
  std::vector<CUgraphNode> nodes(n);
  if (PHOS_REAL(cuGraphGetNodes)(graph, nodes.data(), &n) != CUDA_SUCCESS) return 0;
  uint64_t count = 0;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type;
    if (PHOS_REAL(cuGraphNodeGetType)(node, &type) != CUDA_SUCCESS) continue;
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
      count++;
      if (kernels) kernels->push_back(node_kernel(rt, node));
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child;
      if (PHOS_REAL(cuGraphChildGraphNodeGetGraph)(node, &child) == CUDA_SUCCESS)
        count += kernel_nodes(rt, child, kernels, depth + 1);
    }
  }
  return count;
}

CUresult instantiated(GraphDeps rt, CUresult r, CUgraphExec* exec, CUgraph graph) {
  if (r != CUDA_SUCCESS || !exec) return r;
  bool speculating = rt.speculation().active();
  std::vector<NodeKernel> kernels;
  uint64_t n = kernel_nodes(rt, graph, speculating ? &kernels : nullptr);
  std::lock_guard<std::mutex> lock(g_mu);
  g_kernel_nodes[*exec] = n;
  if (speculating) g_node_kernels[*exec] = std::move(kernels);
  return r;
}

CUresult launched(GraphDeps rt, CUresult r, CUgraphExec exec) {
  if (r != CUDA_SUCCESS) return r;
  rt.counters().count(Counter::kGraphLaunches);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_kernel_nodes.find(exec);
  if (it != g_kernel_nodes.end()) rt.counters().count(Counter::kGraphKernels, it->second);
  if (rt.speculation().active()) {
    auto k = g_node_kernels.find(exec);
    if (k != g_node_kernels.end())
      for (const NodeKernel& node : k->second)
        if (node.kernel) rt.speculation().on_packed_kernel(*node.kernel, node.args.data(), node.args.size());
  }
  return r;
}

}  // namespace

extern "C" PHOS_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  const GraphDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuGraphInstantiateWithFlags));
  return instantiated(rt, PHOS_REAL(cuGraphInstantiateWithFlags)(exec, graph, flags), exec, graph);
}

extern "C" PHOS_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                                             CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  const GraphDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuGraphInstantiateWithParams));
  return instantiated(rt, PHOS_REAL(cuGraphInstantiateWithParams)(exec, graph, params), exec, graph);
}

extern "C" PHOS_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                                  CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  const GraphDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuGraphInstantiateWithParams_ptsz));
  return instantiated(rt, PHOS_REAL(cuGraphInstantiateWithParams_ptsz)(exec, graph, params), exec, graph);
}

extern "C" PHOS_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  const GraphDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuGraphExecDestroy));
  CUresult r = PHOS_REAL(cuGraphExecDestroy)(exec);
  std::lock_guard<std::mutex> lock(g_mu);
  g_kernel_nodes.erase(exec);
  g_node_kernels.erase(exec);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  const GraphDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuGraphLaunch));
  rt.copy_window().before_unknown_call("cuGraphLaunch");
  return launched(rt, PHOS_REAL(cuGraphLaunch)(exec, stream), exec);
}

extern "C" PHOS_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  const GraphDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuGraphLaunch_ptsz));
  rt.copy_window().before_unknown_call("cuGraphLaunch_ptsz");
  return launched(rt, PHOS_REAL(cuGraphLaunch_ptsz)(exec, stream), exec);
}
