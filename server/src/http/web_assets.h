// The files of gacd's page (web/: the HTML, script and style of the page,
// and the charting library uPlot from web/node_modules, pinned by
// web/package-lock.json), compiled into the binary at build time by
// web/embed.cmake, so gacd serves its page with nothing deployed beside it.
//
// Thread safety: constant data.
#ifndef GAC_SERVER_SRC_HTTP_WEB_ASSETS_H_
#define GAC_SERVER_SRC_HTTP_WEB_ASSETS_H_

#include <cstddef>
#include <string_view>

namespace gac::server {

struct WebAsset {
  const char* path;          // URL path, e.g. "/app.js"
  const char* content_type;  // e.g. "text/javascript; charset=utf-8"
  const unsigned char* data;
  std::size_t size;
  const char* etag;          // quoted, from the content's SHA-256
};

// The asset served at `path` ("/" is "/index.html"), or nullptr.
const WebAsset* FindWebAsset(std::string_view path);

// Every asset, `count` of them.
const WebAsset* WebAssets(std::size_t* count);

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_HTTP_WEB_ASSETS_H_
