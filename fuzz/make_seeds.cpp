// Writes the seed corpora for the fuzz harnesses, made from code with the core's own writer
// and encoder (so they follow the format as built): make_seeds OUT_DIR creates
// OUT_DIR/{tbl,decode,kernel}/seed-*.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <jpeglib.h>  // after <cstdio>: it needs FILE and size_t

#include "decode.h"
#include "tbl_format.h"

using namespace tbljax;
using Bytes = std::vector<uint8_t>;

namespace {

void Die(const std::string& what) {
  std::fprintf(stderr, "make_seeds: %s\n", what.c_str());
  std::exit(1);
}
void Ok(const Status& s) {
  if (!s.ok()) Die(s.message());
}

void Save(const std::string& dir, const std::string& name, const Bytes& b) {
  std::ofstream f(dir + "/" + name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) Die("cannot write " + dir + "/" + name);
}

Bytes Load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

Bytes Pattern(int h, int w, int channels, int seed) {
  Bytes p(static_cast<size_t>(h) * w * channels);
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<uint8_t>((i * 7 + seed * 31 + (i / 5) * (i % 3)) & 0xFF);
  return p;
}

Bytes Jpeg(int h, int w, int channels, ChromaSubsampling sub, bool progressive, int quality = 75,
           int restart_mcus = 0) {
  EncodeOptions o;
  o.quality = quality;
  o.subsampling = sub;
  o.progressive = progressive;
  o.restart_mcus = restart_mcus;
  Bytes out, px = Pattern(h, w, channels, h * w);
  Ok(EncodeJpeg(px.data(), h, w, channels, static_cast<ptrdiff_t>(w) * channels, o, &out));
  return out;
}

// A 4-channel JPEG (CMYK, or YCCK when ycck) through libjpeg directly; libjpeg adds the Adobe
// APP14 marker for these colour spaces.
Bytes CmykJpeg(int h, int w, bool ycck) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  jpeg_mem_dest(&c, &buf, &len);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 4;
  c.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, ycck ? JCS_YCCK : JCS_CMYK);
  jpeg_set_quality(&c, 80, TRUE);
  jpeg_start_compress(&c, TRUE);
  Bytes px = Pattern(h, w, 4, 3);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = px.data() + static_cast<size_t>(c.next_scanline) * w * 4;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  Bytes out(buf, buf + len);
  jpeg_destroy_compress(&c);
  std::free(buf);
  return out;
}

// The JPEG with an EXIF APP1 segment holding orientation o right after SOI.
Bytes WithExif(const Bytes& jpeg, int o, bool big_endian) {
  auto u16 = [&](Bytes* b, int v) {
    if (big_endian) b->insert(b->end(), {uint8_t(v >> 8), uint8_t(v)});
    else b->insert(b->end(), {uint8_t(v), uint8_t(v >> 8)});
  };
  auto u32 = [&](Bytes* b, uint32_t v) {
    if (big_endian)
      b->insert(b->end(), {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)});
    else b->insert(b->end(), {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)});
  };
  Bytes tiff;
  tiff.insert(tiff.end(), big_endian ? std::initializer_list<uint8_t>{'M', 'M'}
                                     : std::initializer_list<uint8_t>{'I', 'I'});
  u16(&tiff, 42);
  u32(&tiff, 8);
  u16(&tiff, 1);       // one IFD entry
  u16(&tiff, 0x0112);  // Orientation
  u16(&tiff, 3);       // SHORT
  u32(&tiff, 1);
  u16(&tiff, o);
  u16(&tiff, 0);
  u32(&tiff, 0);  // no next IFD
  Bytes app1 = {'E', 'x', 'i', 'f', 0, 0};
  app1.insert(app1.end(), tiff.begin(), tiff.end());
  const size_t seg = app1.size() + 2;
  Bytes out(jpeg.begin(), jpeg.begin() + 2);
  out.insert(out.end(), {0xFF, 0xE1, uint8_t(seg >> 8), uint8_t(seg)});
  out.insert(out.end(), app1.begin(), app1.end());
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

Bytes Concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Writes a TBL file with the core's writer and returns its bytes.
template <typename AddFn>
Bytes Tbl(const std::string& tmpdir, uint64_t capacity, const std::string& json, AddFn add) {
  const std::string path = tmpdir + "/seed.tbl";
  ::unlink(path.c_str());
  std::unique_ptr<tbl::TblWriter> w;
  Ok(tbl::TblWriter::Create(path, capacity, false, &w));
  add(w.get());
  Ok(w->Finalize(json));
  return Load(path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) Die("usage: make_seeds OUT_DIR");
  const std::string root = argv[1];
  for (const char* d : {"", "/tbl", "/decode", "/box", "/kernel"})
    ::mkdir((root + d).c_str(), 0755);

  // ---- decode: JPEGs of several kinds, each with a few control suffixes ----
  std::vector<Bytes> jpegs = {
      Jpeg(1, 1, 3, ChromaSubsampling::k420, false),
      Jpeg(7, 13, 3, ChromaSubsampling::k420, false),
      Jpeg(16, 16, 3, ChromaSubsampling::k444, false),
      Jpeg(33, 17, 3, ChromaSubsampling::k422, false),
      Jpeg(24, 40, 3, ChromaSubsampling::k420, true),
      Jpeg(9, 9, 1, ChromaSubsampling::k444, false),
      Jpeg(20, 12, 1, ChromaSubsampling::k444, true),
      CmykJpeg(10, 14, false),
      CmykJpeg(8, 8, true),
  };
  const Bytes base = Jpeg(21, 34, 3, ChromaSubsampling::k420, false);
  for (int o = 1; o <= 8; ++o) jpegs.push_back(WithExif(base, o, o % 2 == 0));
  int k = 0;
  for (const Bytes& j : jpegs) {
    for (const Bytes& ctrl : {Bytes{0x00, 15, 0}, Bytes{0x05, 6, 0}, Bytes{0x0E, 40, 0}}) {
      Save(root + "/decode", "seed-" + std::to_string(k++), Concat(j, ctrl));
    }
  }
  Save(root + "/decode", "seed-truncated",
       Concat(Bytes(base.begin(), base.begin() + base.size() / 2), {0, 8, 0}));
  Save(root + "/decode", "seed-raw-pixels", Concat(Pattern(9, 11, 3, 1), {0x03, 20, 10}));
  Save(root + "/decode", "seed-raw-flat", Concat(Bytes(12 * 5 * 3, 77), {0x03, 63, 4}));

  // ---- box: compact-record JPEGs (restart markers, as convert writes them) and a few boxes ----
  const Bytes boxed[] = {
      Jpeg(48, 64, 3, ChromaSubsampling::k420, false, 90, 2),
      Jpeg(40, 48, 3, ChromaSubsampling::k444, false, 90, 2),
      Jpeg(24, 64, 3, ChromaSubsampling::k422, false, 90, 1),
      Jpeg(32, 40, 1, ChromaSubsampling::k444, false, 90, 1),
      Jpeg(33, 70, 3, ChromaSubsampling::k420, false, 90, 0),  // no markers: the usual path
  };
  k = 0;
  for (const Bytes& j : boxed)
    for (const Bytes& ctrl : {Bytes{0, 0, 255, 255}, Bytes{0, 0, 40, 40}, Bytes{128, 100, 90, 60}})
      Save(root + "/box", "seed-" + std::to_string(k++), Concat(j, ctrl));

  // ---- tbl: files from the writer, followed by a control byte asking for right checksums ----
  char tmpl[] = "/tmp/tbljax-seeds-XXXXXX";
  if (!::mkdtemp(tmpl)) Die("mkdtemp failed");
  const std::string tmp = tmpl;
  const std::string json = R"({"tbljax_metadata":1,"num_records":3,"recipe":{"image_size":4}})";
  const Bytes ctrl = {0x07};
  Save(root + "/tbl", "seed-raw",
       Concat(Tbl(tmp, 3, json,
                  [](tbl::TblWriter* w) {
                    for (int i = 0; i < 3; ++i) {
                      Bytes p = Pattern(4, 4, 3, i);
                      Ok(w->Add(p.data(), p.size(), tbl::kRawU8, 4, 4, false));
                    }
                  }),
              ctrl));
  Save(root + "/tbl", "seed-lz4",
       Concat(Tbl(tmp, 3, json,
                  [](tbl::TblWriter* w) {
                    for (int i = 0; i < 3; ++i) {
                      Bytes p(6 * 5 * 3, static_cast<uint8_t>(i));
                      Ok(w->Add(p.data(), p.size(), tbl::kRawU8, 5, 6, true));
                    }
                  }),
              ctrl));
  Save(root + "/tbl", "seed-jpeg",
       Concat(Tbl(tmp, 2, json,
                  [&](tbl::TblWriter* w) {
                    for (const Bytes& j : {jpegs[1], jpegs[5]})
                      Ok(w->Add(j.data(), j.size(), tbl::kJpeg, 13, 7, false));
                  }),
              ctrl));
  Save(root + "/tbl", "seed-mixed",
       Concat(Tbl(tmp, 4, "",
                  [&](tbl::TblWriter* w) {
                    Bytes a = Pattern(2, 3, 3, 1), b = Pattern(3, 2, 3, 2), z(300, 0);
                    Ok(w->Add(a.data(), a.size(), tbl::kRawU8, 3, 2, false));
                    Ok(w->Add(b.data(), b.size(), tbl::kRawU8, 2, 3, true));
                    Ok(w->Add(z.data(), z.size(), tbl::kPng, 10, 10, true));
                    Ok(w->Add(z.data(), 0, tbl::kUnknown, 0, 0, false));
                  }),
              ctrl));
  Save(root + "/tbl", "seed-empty",
       Concat(Tbl(tmp, 0, R"({"num_records":0})", [](tbl::TblWriter*) {}), ctrl));
  Save(root + "/tbl", "seed-empty-bare", Concat(Tbl(tmp, 0, "", [](tbl::TblWriter*) {}), ctrl));
  ::unlink((tmp + "/seed.tbl").c_str());
  ::rmdir(tmp.c_str());

  // ---- kernel: request encodings (see fuzz_kernel.cpp), mostly with consistent shapes ----
  const std::vector<Bytes> requests = {
      {0x1B, 1, 0x41, 4, 0, 0, 0, 0, 8,   8,   0,   1,   2,   3,
       0,    0, 0,    0, 1, 0, 1, 0, 100, 140, 100, 140, 100, 140},
      {0xFF, 2, 0x59, 3, 0, 0, 0, 0, 5, 7, 2, 1,   0,   1,  1,   6,  6,
       2,    2, 5,    5, 0, 0, 3, 4, 1, 0, 1, 120, 130, 90, 150, 60, 180},
      {0x3F, 0, 0x46, 2, 0, 0, 0, 0, 3,   3,   1,   2,   0,  0,
       2,    2, 1,    1, 3, 3, 1, 0, 100, 250, 100, 240, 99, 230},
      {0x12, 1, 0x00, 2, 2, 6, 5, 3, 0, 1, 100, 140, 100, 140, 100, 140},
      {0x09, 0, 0x62, 1, 0, 0, 0, 0, 4, 4, 0x80, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F},
  };
  for (size_t i = 0; i < requests.size(); ++i)
    Save(root + "/kernel", "seed-" + std::to_string(i), requests[i]);
  return 0;
}
