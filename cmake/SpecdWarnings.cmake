# specd_set_warnings(target): the warning set every specd C++ target compiles with.
function(specd_set_warnings target)
  set(_flags -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>")
endfunction()
