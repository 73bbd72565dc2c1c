document.getElementById("confirm").submit();
