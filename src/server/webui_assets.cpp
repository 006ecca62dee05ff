// The web UI's built files (webui/dist/), copied into .rodata by the assembler at build time, as
// model/builtin_model.cpp does with the built-in model. CMake passes the absolute paths and
// rebuilds this object when the files change; ccache is off for it (it would hash only this source).
#include <cstdint>
#include <span>

#define PROMPTLY_EMBED(symbol, file)       \
  asm(".section .rodata." #symbol ", \"a\", @progbits\n" \
      ".global " #symbol "_begin\n"          \
      #symbol "_begin:\n"                    \
      ".incbin \"" file "\"\n"               \
      ".global " #symbol "_end\n"            \
      #symbol "_end:\n"                      \
      ".byte 0\n"                            \
      ".previous\n")

PROMPTLY_EMBED(promptly_webui_index_html, PROMPTLY_WEBUI_DIR "/index.html");
PROMPTLY_EMBED(promptly_webui_index_html_gz, PROMPTLY_WEBUI_DIR "/index.html.gz");

extern "C" const std::uint8_t promptly_webui_index_html_begin[], promptly_webui_index_html_end[];
extern "C" const std::uint8_t promptly_webui_index_html_gz_begin[], promptly_webui_index_html_gz_end[];

namespace promptly::server {

std::span<const std::uint8_t> webui_index_html() {
  return {promptly_webui_index_html_begin, static_cast<std::size_t>(promptly_webui_index_html_end - promptly_webui_index_html_begin)};
}

std::span<const std::uint8_t> webui_index_html_gz() {
  return {promptly_webui_index_html_gz_begin,
          static_cast<std::size_t>(promptly_webui_index_html_gz_end - promptly_webui_index_html_gz_begin)};
}

}  // namespace promptly::server
