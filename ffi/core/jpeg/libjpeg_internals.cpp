// libjpeg's internals, here alone (see libjpeg_internals.h): two of its private module structs
// re-declared by the members we use, and the two functions that use them.
#include "libjpeg_internals.h"

// libjpeg's entropy-decoder module, whose decode_mcu the box decode replaces with ours. The
// definition is libjpeg's internal jpegint.h (not installed); its first two members have been
// these since libjpeg 6b and in every libjpeg-turbo (3.x adds members after them).
struct jpeg_entropy_decoder {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
};
// libjpeg's inverse-DCT module (jpegint.h too), whose per-component method the box decode
// (DecodePartPlanes) calls itself: its first two members, the same in libjpeg 6b and every
// libjpeg-turbo.
struct jpeg_inverse_dct {
  void (*start_pass)(j_decompress_ptr cinfo);
  void (*inverse_DCT[MAX_COMPONENTS])(j_decompress_ptr cinfo, jpeg_component_info* compptr,
                                      JCOEFPTR coef_block, JSAMPARRAY output_buf,
                                      JDIMENSION output_col);
};

namespace tbljax::jpeg_detail {

void ReplaceEntropyDecodeMcu(j_decompress_ptr c,
                             boolean (*decode_mcu)(j_decompress_ptr c, JBLOCKROW* mcu)) {
  c->entropy->decode_mcu = decode_mcu;
}

InverseDct ComponentInverseDct(j_decompress_ptr c, int k) { return c->idct->inverse_DCT[k]; }

}  // namespace tbljax::jpeg_detail
