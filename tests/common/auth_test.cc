// The handshake's two proofs, called directly: the client's answer to a hello, the server's
// welcome, and the client's check of it.
#include "common/auth.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>

namespace copse::auth {
namespace {

const std::string kSecret = "auth-test-secret-0123456789abcdef";

Json Hello() { return {{"op", "hello"}, {"nonce", NewNonce()}, {"version", 1}}; }

TEST_CASE("Auth.TheJobManagerKeepsItsSecretWhereNoOtherUserCanPlantOne") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("copse-auth-test-" + std::to_string(::getpid()));
  fs::remove_all(root);
  // A new state directory is made this user's alone.
  auto made = LoadOrCreateSecret(root / "new");
  REQUIRE(made.ok());
  CHECK((fs::status(root / "new").permissions() & fs::perms::all) == fs::perms::owner_all);
  CHECK(LoadOrCreateSecret(root / "new").ValueOr("") == *made);
  // One others may write in is refused, naming it and what to do.
  fs::create_directories(root / "open");
  fs::permissions(root / "open", fs::perms::all);
  auto open = LoadOrCreateSecret(root / "open");
  CHECK(open.status().code() == StatusCode::kPermissionDenied);
  CHECK(open.status().message().find("writable by every user; chmod o-w it") != std::string::npos);
  CHECK_FALSE(fs::exists(root / "open" / kSecretFileName));
  // A secret, or a state directory, someone else owns is refused (only root can make one here).
  if (::geteuid() == 0) {
    fs::create_directories(root / "theirs");
    REQUIRE(::chown((root / "theirs").c_str(), 65534, 65534) == 0);
    auto theirs = LoadOrCreateSecret(root / "theirs");
    CHECK(theirs.status().code() == StatusCode::kPermissionDenied);
    CHECK(theirs.status().message().find("belongs to user 65534") != std::string::npos);
    REQUIRE(::chown((root / "new" / kSecretFileName).c_str(), 65534, 65534) == 0);
    auto planted = LoadOrCreateSecret(root / "new");
    CHECK(planted.status().code() == StatusCode::kPermissionDenied);
    CHECK(planted.status().message().find("belongs to user 65534") != std::string::npos);
  }
  fs::remove_all(root);
}

TEST_CASE("Auth.BothSidesProveTheyHoldTheSecret") {
  Json hello = Hello();
  auto answer = AnswerHello(hello, kSecret, "daemon");
  REQUIRE(answer.ok());
  CHECK(answer->message["mac"] == Mac(kSecret, hello["nonce"].get<std::string>()));
  CHECK(answer->message["role"] == "daemon");
  Json welcome = Welcome(answer->message, kSecret, hello["nonce"].get<std::string>());
  CHECK(CheckWelcome(welcome, kSecret, *answer).ok());
  // Each connection's proof covers both nonces: a welcome recorded from another is no proof.
  auto other = AnswerHello(hello, kSecret, "daemon");
  REQUIRE(other.ok());
  CHECK(CheckWelcome(welcome, kSecret, *other).code() == StatusCode::kPermissionDenied);
}

TEST_CASE("Auth.AClientRefusesAServerThatCannotProveItself") {
  Json hello = Hello();
  auto answer = AnswerHello(hello, kSecret, "client");
  REQUIRE(answer.ok());
  SUBCASE("no proof") {
    Status st = CheckWelcome({{"op", "welcome"}}, kSecret, *answer);
    CHECK(st.code() == StatusCode::kPermissionDenied);
    CHECK_MESSAGE(st.message().find("did not prove it holds the secret") != std::string::npos, st.ToString());
  }
  SUBCASE("another secret") {
    Json welcome = Welcome(answer->message, "another-secret-0123456789abcdef0123", hello["nonce"].get<std::string>());
    Status st = CheckWelcome(welcome, kSecret, *answer);
    CHECK_MESSAGE(st.message().find("proof is wrong") != std::string::npos, st.ToString());
  }
  SUBCASE("the server's own refusal") {
    Status st = CheckWelcome({{"op", "error"}, {"message", "authentication failed"}}, kSecret, *answer);
    CHECK(st.code() == StatusCode::kPermissionDenied);
    CHECK_MESSAGE(st.message().find("refused: authentication failed") != std::string::npos, st.ToString());
  }
  SUBCASE("a reply that is no welcome") {
    CHECK(CheckWelcome({{"op", "run"}}, kSecret, *answer).code() == StatusCode::kPermissionDenied);
  }
}

TEST_CASE("Auth.AClientMacsOnlyNoncesNotStringsAServerChose") {
  // Else an impostor could send, as its hello's nonce, the string whose MAC another client
  // expects as the server's proof, and get it from this client.
  for (Json nonce : {Json("copse-server/0123456789abcdef0123456789abcdef/0123456789abcdef0123456789abcdef"), Json("n"),
                     Json(std::string(32, 'G')), Json(42), Json()}) {
    Json hello = {{"op", "hello"}, {"nonce", nonce}, {"version", 1}};
    CHECK_MESSAGE(AnswerHello(hello, kSecret, "daemon").status().code() == StatusCode::kInvalidArgument, nonce.dump());
  }
  CHECK_FALSE(AnswerHello({{"op", "welcome"}, {"nonce", NewNonce()}}, kSecret, "daemon").ok());
}

TEST_CASE("Auth.AClientOfAnOlderBuildIsWelcomedWithoutAProof") {
  Json welcome = Welcome({{"op", "auth"}, {"role", "client"}, {"mac", "m"}}, kSecret, NewNonce());
  CHECK(welcome == Json{{"op", "welcome"}});
}

}  // namespace
}  // namespace copse::auth
