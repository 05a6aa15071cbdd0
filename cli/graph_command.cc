#include "cli/graph_command.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/ml_flags.h"
#include "ml/graph_gen.h"

namespace copse::cli {

int WriteJobFile(const Json& job, const std::string& out, const char* command) {
  // One line per stage, edge and output: readable, and a fraction of an indented dump.
  std::string text = "{\n";
  bool first = true;
  for (auto it = job.begin(); it != job.end(); ++it) {
    text += std::string(first ? "" : ",\n") + " " + Json(it.key()).dump() + ": ";
    first = false;
    if (it.value().is_array()) {
      text += "[";
      for (size_t i = 0; i < it.value().size(); ++i) text += std::string(i ? ",\n  " : "\n  ") + it.value()[i].dump();
      text += it.value().empty() ? "]" : "\n ]";
    } else {
      text += it.value().dump();
    }
  }
  text += "\n}\n";
  if (out.empty()) {
    std::cout << text;
  } else {
    std::ofstream file(out);
    file << text;
    if (!file) {
      std::fprintf(stderr, "%s: cannot write %s\n", command, out.c_str());
      return 1;
    }
  }
  return 0;
}

namespace {

int RunGraph(GraphFlags& f, const std::string& kind) {
  f.o.kind = kind;
  if (!f.split.empty()) {  // "2" or "0,2,4": inner boundaries, or all of them
    std::vector<int> b;
    std::stringstream ss(f.split);
    std::string item;
    try {
      while (std::getline(ss, item, ',')) b.push_back(std::stoi(item));
    } catch (const std::exception&) {
      std::fprintf(stderr, "copse graph: --split: expected comma-separated layer indices\n");
      return 2;
    }
    if (b.empty() || b.front() != 0) b.insert(b.begin(), 0);
    f.o.split = b;  // the last boundary (the layer count) is added by the generator when absent
  }
  if (!f.o.split.empty()) {
    auto full = ml::BalancedSplit(f.o.model, 1);
    if (full.ok() && f.o.split.back() != full->back()) f.o.split.push_back(full->back());
  }
  auto job = ml::GenerateTrainingGraph(f.o);
  if (!job.ok()) {
    std::fprintf(stderr, "copse graph %s: %s\n", kind.c_str(), job.status().message().c_str());
    // Flags that do not go together (or a model string) are usage errors; an unreadable
    // dataset is not.
    return job.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  return WriteJobFile(*job, f.out, "copse graph");
}

}  // namespace

void AddTrainingFlags(CLI::App* cmd, GraphFlags& f) {
  ml::GraphOptions& o = f.o;
  cmd->add_option("--model", o.model,
                  "mlp, cnn, mlp:A-B-...-Z, or gpt:LAYERS-WIDTH-HEADS-CONTEXT[,dropout=P] (stages split at blocks)")
      ->capture_default_str();
  cmd->add_option("--epochs", o.epochs, "Passes over the training set")->check(CLI::Range(1, 1000000))->capture_default_str();
  cmd->add_option("--steps", o.steps, "Stop after this many steps (default: all epochs)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--batch", o.batch, "Global batch size")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--lr", o.lr, "Learning rate")->check(FiniteFrom(0, false))->capture_default_str();
  cmd->add_option("--momentum", o.momentum, "SGD momentum")
      ->check(Finite())
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "L2 weight decay")->check(FiniteFrom(0, true))->capture_default_str();
  AddScheduleFlags(cmd, o.lr_schedule, o.warmup_steps, o.min_lr, o.clip_norm,
                   "Clip the gradients' global L2 norm to this before each step (0: never; not for hybrid jobs)");
  AddPrecisionFlag(cmd, o.precision);
  AddInitLossScaleFlag(cmd, o.init_loss_scale);
  cmd->add_option("--device", o.device,
                  "cpu, or cuda: every compute vertex takes a GPU (resources.gpus 1; daemons started with --gpus) "
                  "and keeps its model, activations and gradients on it")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of initialization and shuffling")->check(Unsigned64())->capture_default_str();
  cmd->add_option("--data-dir", o.data_dir,
                  "Fashion-MNIST directory (gpt models: the fortunes text's, /usr/share/games/fortunes unless given), as "
                  "the daemons see it (read here too, for the training set's size)")
      ->capture_default_str();
  cmd->add_option("--limit", o.limit, "Use only the first N training images")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--test-limit", o.test_limit, "Use only the first N test images")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--threads", o.threads, "CPUs (threads) per compute vertex")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--daemon-cpus", o.daemon_cpus, "Slots per daemon (copse run --cpus); init vertices take them all")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "A file checkpoint every K steps (0: none)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->capture_default_str();
  cmd->add_option("--checkpoint-dir", o.checkpoint_dir, "Checkpoint directory, relative to the job file")->capture_default_str();
  cmd->add_option("--mirror-every", o.mirror_every,
                  "Pipelines: copy every K-th step's parameters and optimizer state into a second daemon's memory, so a "
                  "lost stage resumes from its newest copy (0: never)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->capture_default_str();
  cmd->add_option("--name", o.name, "Job name");
  cmd->add_option("-f,--file,--out", f.out, "write the job file here instead of standard output");
}

namespace {

void AddTensorParallelFlags(CLI::App* cmd, ml::GraphOptions& o, int min) {
  cmd->add_option("--tensor-parallel", o.tensor_parallel,
                  "Tensor-parallel members per gang: each gpt block split over them (HEADS must be a multiple)")
      ->check(CLI::Range(min, 16))
      ->capture_default_str();
  cmd->add_option("--tp-channel", o.tp_channel, "Their live channels: shm (a gang on one daemon) or stream (across daemons)")
      ->check(CLI::IsMember({"shm", "stream"}))
      ->capture_default_str();
}

void AddPipelineFlags(CLI::App* cmd, GraphFlags& f) {
  ml::GraphOptions& o = f.o;
  AddTensorParallelFlags(cmd, o, 1);
  cmd->add_option("--stages", o.stages, "Pipeline stages")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--microbatches", o.microbatches, "Micro-batches per step")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--schedule", o.schedule, "gpipe, 1f1b or interleaved (1F1B over virtual stages)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}))
      ->capture_default_str();
  cmd->add_option("--virtual-stages", o.virtual_stages,
                  "With --schedule interleaved: model chunks per stage (daemon); --microbatches a multiple of --stages")
      ->check(CLI::Range(2, 16))
      ->capture_default_str();
  cmd->add_flag("--recompute", o.recompute, "Backward recomputes the forward instead of stashing activations");
  cmd->add_option("--weight-grads", o.weight_grads,
                  "batched (each stage's update computes the weight gradients of all micro-batches in one product, "
                  "where its layers allow and activations are stashed) or per-microbatch")
      ->check(CLI::IsMember({"batched", "per-microbatch"}))
      ->capture_default_str();
  cmd->add_option("--split", f.split, "Stage boundaries as layer indices, e.g. 2 (default: balanced by cost)");
}

}  // namespace

void AddGraphCommand(CLI::App& app) {
  CLI::App* graph =
      app.add_subcommand("graph", "Write a training job file (data-parallel, pipeline, hybrid, tensor-parallel) to stdout");
  graph->require_subcommand(1);

  auto dp = std::make_shared<GraphFlags>();
  CLI::App* d = graph->add_subcommand("data-parallel", "W workers, gradients reduced by a tree, a ring or a parameter server");
  d->add_option("--workers", dp->o.workers, "Data-parallel workers")->check(CLI::Range(1, 64))->capture_default_str();
  d->add_option("--reducer", dp->o.reducer, "tree, ring, ps or nccl (GPU gangs)")
      ->check(CLI::IsMember({"tree", "ring", "ps", "nccl"}))
      ->capture_default_str();
  d->add_option("--fanin", dp->o.fanin, "Fan-in of the reduction tree")->check(CLI::Range(2, 64))->capture_default_str();
  d->add_option("--staleness", dp->o.staleness,
                "Step t's gradients are computed on step t-S's parameters (bounded staleness; 0: synchronous)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  d->add_flag("--loader-vertices", dp->o.loader_vertices, "A shard-loader vertex feeds each gradient vertex");
  AddTrainingFlags(d, *dp);
  d->callback([dp] { ExitCode() = RunGraph(*dp, "data-parallel"); });

  auto pp = std::make_shared<GraphFlags>();
  CLI::App* p = graph->add_subcommand("pipeline", "P stages x M micro-batches, GPipe or 1F1B schedule");
  pp->o.microbatches = 8;
  AddPipelineFlags(p, *pp);
  AddTrainingFlags(p, *pp);
  p->callback([pp] { ExitCode() = RunGraph(*pp, "pipeline"); });

  auto hp = std::make_shared<GraphFlags>();
  CLI::App* h = graph->add_subcommand("hybrid", "W data-parallel pipelines of P stages each");
  h->add_option("--workers", hp->o.workers, "Data-parallel pipelines")->check(CLI::Range(1, 64))->capture_default_str();
  AddPipelineFlags(h, *hp);
  AddTrainingFlags(h, *hp);
  h->callback([hp] { ExitCode() = RunGraph(*hp, "hybrid"); });

  auto tp = std::make_shared<GraphFlags>();
  CLI::App* t = graph->add_subcommand(
      "tensor-parallel", "a gpt model's blocks split over T members per step (Megatron-style), joined by live channels");
  tp->o.model = "gpt:4-128-4-64";
  tp->o.optimizer = "adamw";
  tp->o.lr = 3e-3;
  tp->o.tensor_parallel = 2;
  AddTensorParallelFlags(t, tp->o, 2);
  AddTrainingFlags(t, *tp);
  t->callback([tp] { ExitCode() = RunGraph(*tp, "tensor-parallel"); });
}

}  // namespace copse::cli
