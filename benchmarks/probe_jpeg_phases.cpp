// Where a JPEG decode's time goes, per record of a compact file (libjpeg-turbo directly): mode 0
// entropy decoding only (jpeg_read_coefficients), 1 a whole ISLOW decode with fancy upsampling,
// 2 without fancy upsampling, 3 IFAST, 4 at 1/8 scale. With a second argument the records are
// first losslessly re-written ("o": optimized Huffman tables, "r": a restart marker every MCU).
// Behind the "Huffman is ~70% of a decode" figure in benchmarks/README.md. Build and run:
//   g++ -O2 benchmarks/probe_jpeg_phases.cpp -o /tmp/phases -ljpeg
//   python -c "import struct, tbljax; ds = tbljax.open('c.tbl'); v, _, o, n, _, _ = ds.jpeg_records();
//     f = open('/tmp/blobs.bin', 'wb'); f.write(struct.pack('<I', len(o)));
//     [f.write(struct.pack('<I', int(s)) + v[0][a:a + s].tobytes()) for a, s in zip(o, n)]"
//   /tmp/phases /tmp/blobs.bin [o|r]
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <chrono>
#include <jpeglib.h>
#include <fstream>
#include <cstring>
// reads blobs file: [u32 n][u32 size, bytes]...
int main(int argc, char** argv) {
  std::ifstream f(argv[1], std::ios::binary);
  std::vector<std::vector<unsigned char>> blobs;
  uint32_t n; f.read((char*)&n, 4);
  for (uint32_t i = 0; i < n; i++) { uint32_t s; f.read((char*)&s, 4); blobs.emplace_back(s); f.read((char*)blobs.back().data(), s); }
  std::vector<unsigned char> buf(4096 * 4096 * 3);
  if (argc > 2) { // transcode with optimize_coding / restart
    std::vector<std::vector<unsigned char>> outb; size_t t0=0,t1=0;
    for (auto& b : blobs) {
      jpeg_decompress_struct c; jpeg_error_mgr e; c.err = jpeg_std_error(&e);
      jpeg_create_decompress(&c); jpeg_mem_src(&c, b.data(), b.size()); jpeg_read_header(&c, TRUE);
      jvirt_barray_ptr* co = jpeg_read_coefficients(&c);
      jpeg_compress_struct w; jpeg_error_mgr e2; w.err = jpeg_std_error(&e2); jpeg_create_compress(&w);
      unsigned char* ob = nullptr; unsigned long ol = 0; jpeg_mem_dest(&w, &ob, &ol);
      jpeg_copy_critical_parameters(&c, &w);
      if (argv[2][0]=='o') w.optimize_coding = TRUE;
      if (argv[2][0]=='r') w.restart_interval = 1;
      jpeg_write_coefficients(&w, co); jpeg_finish_compress(&w); jpeg_destroy_compress(&w);
      jpeg_finish_decompress(&c); jpeg_destroy_decompress(&c);
      t0 += b.size(); t1 += ol; outb.emplace_back(ob, ob+ol); free(ob);
    }
    printf("bytes %.0f -> %.0f\n", (double)t0/blobs.size(), (double)t1/blobs.size());
    blobs.swap(outb);
  }
  for (int mode = 0; mode < 5; mode++) {
    auto t0 = std::chrono::steady_clock::now();
    long px = 0;
    for (int rep = 0; rep < 3; rep++)
    for (auto& b : blobs) {
      jpeg_decompress_struct c; jpeg_error_mgr e; c.err = jpeg_std_error(&e);
      jpeg_create_decompress(&c);
      jpeg_mem_src(&c, b.data(), b.size());
      jpeg_read_header(&c, TRUE);
      if (mode == 0) { jpeg_read_coefficients(&c); }
      else {
        c.out_color_space = JCS_RGB; c.dct_method = JDCT_ISLOW;
        if (mode == 2) c.do_fancy_upsampling = FALSE;
        if (mode == 3) c.dct_method = JDCT_IFAST;
        if (mode == 4) { c.scale_num = 1; c.scale_denom = 8; }
        jpeg_start_decompress(&c);
        while (c.output_scanline < c.output_height) { JSAMPROW r = buf.data() + c.output_scanline * c.output_width * 3; jpeg_read_scanlines(&c, &r, 1); }
        px += c.output_width * c.output_height;
      }
      jpeg_abort_decompress(&c);
      jpeg_destroy_decompress(&c);
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("mode %d (%s): %.1f us/img\n", mode, mode==0?"huffman only":mode==1?"full islow fancy":mode==2?"islow no-fancy":mode==3?"ifast fancy":"scale 1/8", dt / (3*blobs.size()) * 1e6);
  }
}
