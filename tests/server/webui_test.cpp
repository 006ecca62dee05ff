#include "server/webui.h"

#include <gtest/gtest.h>

#include <boost/beast/zlib/inflate_stream.hpp>
#include <string>
#include <vector>

namespace promptly::server {
namespace {

TEST(WebUi, GzipIsAcceptedOnlyWithAPositiveWeight) {
  EXPECT_TRUE(accepts_gzip("gzip, deflate, br, zstd"));
  EXPECT_TRUE(accepts_gzip("deflate, GZIP;q=0.5"));
  EXPECT_TRUE(accepts_gzip("*"));
  EXPECT_TRUE(accepts_gzip("x-gzip"));
  EXPECT_FALSE(accepts_gzip(""));
  EXPECT_FALSE(accepts_gzip("br, deflate"));
  EXPECT_FALSE(accepts_gzip("gzip;q=0"));
  EXPECT_FALSE(accepts_gzip("gzip;q=0.0, *;q=1"));  // named explicitly: overrides *
  EXPECT_FALSE(accepts_gzip("*;q=0"));
  EXPECT_FALSE(accepts_gzip("gzip;q=abc"));
  EXPECT_FALSE(accepts_gzip("gzip;q=2"));
  EXPECT_FALSE(accepts_gzip("gzipped"));
  EXPECT_TRUE(accepts_gzip(" ,, gzip ; q=1 ,"));
}

TEST(WebUi, IfNoneMatchComparesTagsWeakly) {
  const std::string etag = "\"0123abcd\"";
  EXPECT_TRUE(etag_matches("\"0123abcd\"", etag));
  EXPECT_TRUE(etag_matches("W/\"0123abcd\"", etag));
  EXPECT_TRUE(etag_matches("\"other\", \"0123abcd\"", etag));
  EXPECT_TRUE(etag_matches(" * ", etag));
  EXPECT_FALSE(etag_matches("", etag));
  EXPECT_FALSE(etag_matches("0123abcd", etag));  // unquoted: not an entity tag
  EXPECT_FALSE(etag_matches("\"0123abcd-gzip\"", etag));
  EXPECT_FALSE(etag_matches("W/", etag));
}

TEST(WebUi, EtagsDependOnTheBytesAndTheRepresentation) {
  const std::vector<std::uint8_t> a = {1, 2, 3}, b = {1, 2, 4};
  EXPECT_EQ(make_etag(a), make_etag(a));
  EXPECT_NE(make_etag(a), make_etag(b));
  EXPECT_NE(make_etag(a), make_etag(a, "-gzip"));
  EXPECT_EQ(make_etag(a).front(), '"');
  EXPECT_EQ(make_etag(a).back(), '"');
}

// The gzip copy must hold exactly the plain page: browsers get one, curl the other.
TEST(WebUi, EmbeddedPageAndItsGzipCopyAgree) {
  const WebAsset* page = find_web_asset("/");
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(find_web_asset("/index.html"), page);
  EXPECT_EQ(find_web_asset("/v1/models"), nullptr);
  EXPECT_EQ(find_web_asset("/index.htm"), nullptr);
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  const std::string html(page->plain.begin(), page->plain.end());
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(html.find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(page->etag_plain, page->etag_gzipped);

  // RFC 1952: a 10-byte header (magic 1f 8b, method 8 = deflate; no optional fields from Node's
  // zlib), the raw deflate stream, then CRC-32 and the size mod 2^32.
  const std::span<const std::uint8_t> gz = page->gzipped;
  ASSERT_GT(gz.size(), 18u);
  EXPECT_EQ(gz[0], 0x1f);
  EXPECT_EQ(gz[1], 0x8b);
  EXPECT_EQ(gz[2], 8);
  EXPECT_EQ(gz[3], 0);
  const std::uint32_t size = gz[gz.size() - 4] | gz[gz.size() - 3] << 8 | gz[gz.size() - 2] << 16 | static_cast<std::uint32_t>(gz[gz.size() - 1]) << 24;
  EXPECT_EQ(size, page->plain.size());

  boost::beast::zlib::inflate_stream inflate;
  inflate.reset(15);
  std::string out(page->plain.size() + 64, '\0');
  boost::beast::zlib::z_params z;
  z.next_in = gz.data() + 10;
  z.avail_in = gz.size() - 18;
  z.next_out = out.data();
  z.avail_out = out.size();
  boost::beast::error_code ec;
  inflate.write(z, boost::beast::zlib::Flush::finish, ec);
  EXPECT_TRUE(ec == boost::beast::zlib::error::end_of_stream) << ec.message();
  out.resize(z.total_out);
  EXPECT_TRUE(out == html) << "webui/dist/index.html.gz does not decompress to webui/dist/index.html: rerun tools/build-webui.sh";
}

}  // namespace
}  // namespace promptly::server
