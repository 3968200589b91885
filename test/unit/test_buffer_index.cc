// placeholder: filled by the speculation issue
#include <catch2/catch.hpp>
