// `copse-node`: every copse verb, the job manager, the daemons and the ML programs included.
// Users run `copse` (client_main.cc), which hands the verbs that need these over to it.
#include "cli/app_main.h"
#include "cli/commands.h"
#include "cli/graph_command.h"
#include "cli/plan_command.h"
#include "cli/train_command.h"

int main(int argc, char** argv) {
  copse::cli::DieWithParentIfAsked();
  CLI::App app{"copse: a Dryad-style DAG job scheduler for ML workloads"};
  copse::cli::AddValidateCommand(app);
  copse::cli::AddProgramsCommand(app);
  copse::cli::AddJmCommand(app);
  copse::cli::AddDaemonCommand(app);
  copse::cli::AddClientCommands(app);
  copse::cli::AddRunCommand(app);
  copse::cli::AddTrainCommand(app);
  copse::cli::AddGraphCommand(app);
  copse::cli::AddPlanCommand(app);
  return copse::cli::RunApp(app, argc, argv);
}
