# SPECD_SANITIZE: AddressSanitizer + UndefinedBehaviorSanitizer on every C++ target, with any
# UB report fatal so that ctest fails on it. CUDA sources are not instrumented.
if(SPECD_SANITIZE)
  set(_specd_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_specd_san}>")
  add_link_options(-fsanitize=address,undefined)
endif()
