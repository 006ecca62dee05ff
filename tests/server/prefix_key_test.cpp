// The prefix key must equal what deploy/haproxy/haproxy.cfg computes from the body (HAProxy's crc32
// converter is zlib's CRC-32; the expected values are Python's zlib.crc32 of the same bytes).
#include "server/prefix_key.h"

#include <gtest/gtest.h>

namespace promptly::server {
namespace {

using nlohmann::ordered_json;

TEST(PrefixKey, Crc32IsZlibs) {
  EXPECT_EQ(crc32(""), 0u);
  EXPECT_EQ(crc32("hi"), 3633523372u);
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32("h\xc3\xa9"), 4133018699u);
}

TEST(PrefixKey, FirstUserMessageAlone) {
  const ordered_json turn1 = ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  const ordered_json turn2 = ordered_json::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},
                                                    {"role":"user","content":"more"}])");
  EXPECT_EQ(prefix_key(turn1), "3633523372");
  EXPECT_EQ(prefix_key(turn2), "3633523372");
}

TEST(PrefixKey, SystemPromptAndFirstUserMessage) {
  const ordered_json a = ordered_json::parse(R"([{"role":"system","content":"sys"},{"role":"user","content":"hi"}])");
  const ordered_json b = ordered_json::parse(R"([{"role":"system","content":"sys"},{"role":"user","content":"hi"},
                                                 {"role":"assistant","content":"x"},{"role":"user","content":"y"}])");
  const ordered_json other = ordered_json::parse(R"([{"role":"system","content":"sys"},{"role":"user","content":"bye"}])");
  EXPECT_EQ(prefix_key(a), "2711252046");  // zlib.crc32(b"syshi")
  EXPECT_EQ(prefix_key(b), prefix_key(a));
  EXPECT_NE(prefix_key(other), prefix_key(a));
  const ordered_json developer = ordered_json::parse(R"([{"role":"developer","content":"sys"},{"role":"user","content":"hi"}])");
  EXPECT_EQ(prefix_key(developer), prefix_key(a));
}

TEST(PrefixKey, TextPartsAndMissingText) {
  const ordered_json parts = ordered_json::parse(R"([{"role":"user","content":[{"type":"text","text":"h"},{"type":"text","text":"i"}]}])");
  EXPECT_EQ(prefix_key(parts), "3633523372");
  EXPECT_EQ(prefix_key(ordered_json::array()), std::nullopt);
  EXPECT_EQ(prefix_key(ordered_json::parse(R"([{"role":"assistant","content":null}])")), std::nullopt);
}

}  // namespace
}  // namespace promptly::server
