#pragma once
// The dashboard's files (jobmanager/dashboard/), compiled into the job manager by the build
// (cmake/embed_assets.cmake), so that `copse jm` serves them with nothing to install.
#include <span>
#include <string_view>

namespace copse::jm {

struct DashboardAsset {
  std::string_view path;  // as served: "/", "/dashboard.js", …
  std::string_view content_type;
  std::string_view body;
};

std::span<const DashboardAsset> DashboardAssets();

}  // namespace copse::jm
