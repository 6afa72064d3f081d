// The one place that depends on libjpeg's internals (its private jpegint.h, which is not
// installed): two of its modules, re-declared by their leading members in
// libjpeg_internals.cpp alone, reached through the two functions here. Only the box decode
// (decode_box.cpp) uses them, after jpeg_start_decompress; no file that reads a header
// (jpeg_read_header) sees these declarations. A libjpeg whose modules start otherwise breaks
// these two functions and nothing else.
#pragma once
#include <cstdio>  // jpeglib.h needs FILE

#include <jpeglib.h>

namespace tbljax::jpeg_detail {

// Makes `decode_mcu` the decoder of the scan's MCUs in place of libjpeg's entropy decoder
// (its module's decode_mcu method).
void ReplaceEntropyDecodeMcu(j_decompress_ptr c,
                             boolean (*decode_mcu)(j_decompress_ptr c, JBLOCKROW* mcu));

// libjpeg's inverse DCT of component k, as the output pass that jpeg_start_decompress began set
// it up (its inverse-DCT module's inverse_DCT[k]).
using InverseDct = void (*)(j_decompress_ptr c, jpeg_component_info* comp, JCOEFPTR coef_block,
                            JSAMPARRAY output_buf, JDIMENSION output_col);
InverseDct ComponentInverseDct(j_decompress_ptr c, int k);

}  // namespace tbljax::jpeg_detail
